//! Checkpoints of a training run: the model record (parameters, delayed-scaling scales and amax
//! histories, router biases), the exact values of the parameters whose dtype is not the
//! backend's float type (`exact-params`: Burn's records load floats in the backend's type, which
//! would round the router's f32 weight to BF16 on the CUDA BF16 backend), the optimizer record
//! (AdamW moments and step counts), and
//! `state.json` (next step, seed, the run config and recipe it was trained with, the
//! stochastic-rounding stream positions), and the GEMM algorithm choices (`gemm-tuning.json`, so
//! the resumed run's GEMMs sum in the same order on CUDA). The data position is the step (see
//! `data.rs`), so these are everything a resumed run needs to continue exactly as the
//! uninterrupted one.
//! Written to a temporary directory and renamed, so an interrupted save leaves the previous one.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use burn::module::{Module, ModuleMapper, ModuleVisitor, Param, ParamId};
use burn::optim::Optimizer;
use burn::record::{BinFileRecorder, FullPrecisionSettings, Recorder};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{Element, Tensor};
use burn_lowp::backend::exact_record::ExactParam;
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
        .record(ExactFloats::of(model).0, staging.join(EXACT_PARAMS))
        .map_err(|e| LowpError::file(staging.join(format!("{EXACT_PARAMS}.bin")), e))?;
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
    // The record's floats load in the backend's float type; the parameters of another dtype get
    // their saved values back, bit for bit, from `exact-params`.
    let exact: Vec<ExactParam<B, 1>> = recorder()
        .load(dir.join(EXACT_PARAMS), device)
        .map_err(|e| LowpError::file(dir.join(format!("{EXACT_PARAMS}.bin")), e))?;
    let mut restore = RestoreExact(exact.into_iter().map(|p| (p.id, p.tensor)).collect());
    let model = model.load_record(record).map(&mut restore);
    if let Some(id) = restore.0.keys().next() {
        return Err(LowpError::file(
            dir.join(format!("{EXACT_PARAMS}.bin")),
            format!("holds parameter {id}, which the model does not have"),
        ));
    }
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

/// The file of the parameters whose dtype is not the backend's float type.
const EXACT_PARAMS: &str = "exact-params";

/// The float parameters whose dtype is not the backend's float type, flattened, with their ids.
struct ExactFloats<B: Backend>(Vec<ExactParam<B, 1>>);

impl<B: Backend> ExactFloats<B> {
    fn of<M: Module<B>>(module: &M) -> Self {
        let mut found = ExactFloats(Vec::new());
        module.visit(&mut found);
        found
    }
}

impl<B: Backend> ModuleVisitor<B> for ExactFloats<B> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        let value = param.val();
        if value.dtype() != <B::FloatElem as Element>::dtype() {
            let n = value.shape().num_elements();
            self.0.push(ExactParam { id: param.id, tensor: value.reshape([n]) });
        }
    }
}

/// Gives each parameter found in the map its saved value (in its saved dtype), taking it out.
struct RestoreExact<B: Backend>(HashMap<ParamId, Tensor<B, 1>>);

impl<B: Backend> ModuleMapper<B> for RestoreExact<B> {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
        match self.0.remove(&param.id) {
            Some(saved) => param.map(|t| {
                let value = saved.reshape(t.shape());
                if t.is_require_grad() { value.require_grad() } else { value }
            }),
            None => param,
        }
    }
}
