//! Checkpoints of a training run: the model record (parameters, delayed-scaling scales and amax
//! histories, router biases), the optimizer record (AdamW moments and step counts), and
//! `state.json` (next step, seed, the run config and recipe it was trained with, the
//! stochastic-rounding stream positions), and the GEMM algorithm choices (`gemm-tuning.json`, so
//! the resumed run's GEMMs sum in the same order on CUDA). The data position is the step (see
//! `data.rs`), so these are everything a resumed run needs to continue exactly as the
//! uninterrupted one.
//! Written to a temporary directory and renamed, so an interrupted save leaves the previous one.

use std::path::{Path, PathBuf};

use burn::module::{Module, ModuleMapper, ModuleVisitor, Param};
use burn::optim::Optimizer;
use burn::record::{BinFileRecorder, FullPrecisionSettings, Recorder};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{DType, Tensor};
use burn_lowp::error::LowpError;
use burn_lowp::moe::MoeLm;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct CheckpointState {
    /// The step the resumed run starts at.
    pub next_step: usize,
    pub seed: u64,
    /// The run config, as JSON (a resume under another config is refused).
    pub run_config: serde_json::Value,
    /// The recipe, as JSON (a resume under another recipe is refused).
    pub recipe: serde_json::Value,
    /// Quantize calls per GEMM (`MoeLm::lowp_states` order): stochastic-rounding positions.
    pub quantize_calls: Vec<u64>,
}

/// The checkpoint's GEMM algorithm choices (`backend::gemm_tuning`).
pub const TUNING_FILE: &str = "gemm-tuning.json";

/// Loads the checkpoint's GEMM algorithm choices, if it has them (older checkpoints do not), so
/// that the resumed run's GEMMs use the algorithms the interrupted run used.
pub fn load_tuning(dir: &Path) -> Result<(), LowpError> {
    let path = dir.join(TUNING_FILE);
    if path.is_file() {
        burn_lowp::backend::load_gemm_tuning(&path)?;
    }
    Ok(())
}

fn recorder() -> BinFileRecorder<FullPrecisionSettings> {
    BinFileRecorder::new()
}

/// Saves into `dir` (replacing what is there).
pub fn save<B, O>(dir: &Path, model: &MoeLm<B>, optim: &O, state: &CheckpointState) -> Result<(), LowpError>
where
    B: AutodiffBackend,
    O: Optimizer<MoeLm<B>, B>,
{
    let staging = PathBuf::from(format!("{}.saving", dir.display()));
    let _ = std::fs::remove_dir_all(&staging);
    std::fs::create_dir_all(&staging).map_err(|e| LowpError::file(&staging, e))?;
    recorder()
        .record(model.clone().into_record(), staging.join("model"))
        .map_err(|e| LowpError::file(staging.join("model.bin"), e))?;
    recorder()
        .record(optim.to_record(), staging.join("optimizer"))
        .map_err(|e| LowpError::file(staging.join("optimizer.bin"), e))?;
    let json = serde_json::to_string_pretty(state).expect("checkpoint state serializes");
    std::fs::write(staging.join("state.json"), json).map_err(|e| LowpError::file(staging.join("state.json"), e))?;
    // The GEMM algorithms the run uses, so that the resumed run sums as this one does.
    burn_lowp::backend::save_gemm_tuning(staging.join(TUNING_FILE))?;
    let _ = std::fs::remove_dir_all(dir);
    std::fs::rename(&staging, dir).map_err(|e| LowpError::file(dir, e))
}

/// Reads `dir/state.json`.
pub fn load_state(dir: &Path) -> Result<CheckpointState, LowpError> {
    let path = dir.join("state.json");
    let text = std::fs::read_to_string(&path).map_err(|e| LowpError::file(&path, e))?;
    serde_json::from_str(&text).map_err(|e| LowpError::file(&path, e))
}

/// Loads the model and optimizer records of `dir` into `model` and `optim`, and the
/// stochastic-rounding positions of `state`.
pub fn restore<B, O>(dir: &Path, model: MoeLm<B>, optim: O, state: &CheckpointState, device: &B::Device) -> Result<(MoeLm<B>, O), LowpError>
where
    B: AutodiffBackend,
    O: Optimizer<MoeLm<B>, B>,
{
    let record = recorder()
        .load(dir.join("model"), device)
        .map_err(|e| LowpError::file(dir.join("model.bin"), e))?;
    // A record's floats load in the backend's float dtype, but some parameters keep another
    // (the f32 amax histories and scales of a BF16 backend): a resumed CUDA run failed on them
    // (H100, 2026-11-28). So every float parameter gets back the dtype the fresh model gave it.
    let mut dtypes = FloatDtypes(Vec::new());
    model.visit(&mut dtypes);
    let model = model.load_record(record).map(&mut CastBack(dtypes.0.into_iter()));
    let states = model.lowp_states();
    if states.len() != state.quantize_calls.len() {
        return Err(LowpError::file(
            dir.join("state.json"),
            format!("quantize_calls has {} entries; the model has {} GEMMs", state.quantize_calls.len(), states.len()),
        ));
    }
    for (lowp, &calls) in states.iter().zip(&state.quantize_calls) {
        lowp.set_quantize_calls(calls);
    }
    let record = recorder()
        .load(dir.join("optimizer"), device)
        .map_err(|e| LowpError::file(dir.join("optimizer.bin"), e))?;
    Ok((model, optim.load_record(record)))
}

/// The dtypes of a module's float parameters, in visit order.
struct FloatDtypes(Vec<DType>);

impl<B: Backend> ModuleVisitor<B> for FloatDtypes {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        self.0.push(param.val().dtype());
    }
}

/// Casts each float parameter, in visit order, to the next of the dtypes given.
struct CastBack(std::vec::IntoIter<DType>);

impl<B: Backend> ModuleMapper<B> for CastBack {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
        match self.0.next() {
            Some(dtype) => param.map(|t| if t.dtype() == dtype { t } else { t.cast(dtype) }),
            None => param,
        }
    }
}
