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
//!
//! An expert-parallel run's ranks hold different experts: its checkpoint keeps the records of
//! each EP rank in `ep-rank-<r>/` (written by the rank of EP group 0 that holds those experts;
//! the ranks of other groups hold the same ones), beside rank 0's `state.json` and GEMM choices.
//! A resumed rank loads its EP rank's records, so the run resumes with any world size that is a
//! multiple of the same `expert_parallel_size` (the run config, which must match).

use std::path::{Path, PathBuf};

use burn::module::Module;
use burn::optim::Optimizer;
use burn::record::{BinFileRecorder, FullPrecisionSettings, Recorder};
use burn::tensor::backend::AutodiffBackend;
use burn_lowp::backend::exact_record::{exact_params, restore_exact_params, ExactParam};
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

/// The records of a model and its optimizer: the model, the exact values of its parameters of
/// another dtype than the backend's, the optimizer.
fn write_records<B, O>(dir: &Path, model: &MoeLm<B>, optim: &O) -> Result<(), LowpError>
where
    B: AutodiffBackend,
    O: Optimizer<MoeLm<B>, B>,
{
    recorder()
        .record(model.clone().into_record(), dir.join("model"))
        .map_err(|e| LowpError::file(dir.join("model.bin"), e))?;
    recorder()
        .record(exact_params(model), dir.join(EXACT_PARAMS))
        .map_err(|e| LowpError::file(dir.join(format!("{EXACT_PARAMS}.bin")), e))?;
    recorder()
        .record(optim.to_record(), dir.join("optimizer"))
        .map_err(|e| LowpError::file(dir.join("optimizer.bin"), e))
}

/// `state.json` and the GEMM algorithm choices (the resumed run's GEMMs sum as this one's do).
fn write_state(dir: &Path, state: &CheckpointState) -> Result<(), LowpError> {
    let json = serde_json::to_string_pretty(state).expect("checkpoint state serializes");
    std::fs::write(dir.join("state.json"), json).map_err(|e| LowpError::file(dir.join("state.json"), e))?;
    burn_lowp::backend::save_gemm_tuning(dir.join(TUNING_FILE))?;
    Ok(())
}

/// An empty directory at `path` (what was there removed).
fn fresh_dir(path: &Path) -> Result<(), LowpError> {
    let _ = std::fs::remove_dir_all(path);
    std::fs::create_dir_all(path).map_err(|e| LowpError::file(path, e))
}

/// `staging` becomes `dir` (the previous checkpoint removed just before).
fn commit(staging: &Path, dir: &Path) -> Result<(), LowpError> {
    let _ = std::fs::remove_dir_all(dir);
    std::fs::rename(staging, dir).map_err(|e| LowpError::file(dir, e))
}

fn staging_dir(dir: &Path, what: &str) -> PathBuf {
    PathBuf::from(format!("{}.{what}", dir.display()))
}

/// Saves into `dir` (replacing what is there).
pub fn save<B, O>(dir: &Path, model: &MoeLm<B>, optim: &O, state: &CheckpointState) -> Result<(), LowpError>
where
    B: AutodiffBackend,
    O: Optimizer<MoeLm<B>, B>,
{
    let staging = staging_dir(dir, "saving");
    fresh_dir(&staging)?;
    write_records(&staging, model, optim)?;
    write_state(&staging, state)?;
    commit(&staging, dir)
}

/// Where EP rank `ep_rank`'s records are in an expert-parallel checkpoint.
pub fn shard_dir(dir: &Path, ep_rank: usize) -> PathBuf {
    dir.join(format!("ep-rank-{ep_rank}"))
}

/// One rank's part of an expert-parallel checkpoint. Every rank calls it at the same step.
pub struct ShardedSave<'a> {
    /// This rank's index in its EP group, and the group's size.
    pub ep_rank: usize,
    pub ep_size: usize,
    /// This rank writes its EP rank's records (it is in EP group 0).
    pub writes_shard: bool,
    /// This rank writes `state.json` and puts the checkpoint together (rank 0).
    pub writes_state: bool,
    /// Returns once every rank has called it.
    pub barrier: &'a dyn Fn() -> Result<(), LowpError>,
}

/// Saves an expert-parallel checkpoint into `dir`: each shard's writer writes its records to a
/// directory of its own; once every rank is past the first barrier, rank 0 moves them into the
/// new checkpoint beside `state.json` and renames it into place; the second barrier keeps a fast
/// rank from writing the next checkpoint's shard before this one is in place.
pub fn save_sharded<B, O>(dir: &Path, model: &MoeLm<B>, optim: &O, state: &CheckpointState, part: &ShardedSave) -> Result<(), LowpError>
where
    B: AutodiffBackend,
    O: Optimizer<MoeLm<B>, B>,
{
    let shard_staging = |r: usize| staging_dir(dir, &format!("saving-ep-rank-{r}"));
    if part.writes_shard {
        let mine = shard_staging(part.ep_rank);
        fresh_dir(&mine)?;
        write_records(&mine, model, optim)?;
    }
    (part.barrier)()?;
    if part.writes_state {
        let staging = staging_dir(dir, "saving");
        fresh_dir(&staging)?;
        for r in 0..part.ep_size {
            let from = shard_staging(r);
            std::fs::rename(&from, shard_dir(&staging, r)).map_err(|e| LowpError::file(&from, e))?;
        }
        write_state(&staging, state)?;
        commit(&staging, dir)?;
    }
    (part.barrier)()
}

/// Reads `dir/state.json`.
pub fn load_state(dir: &Path) -> Result<CheckpointState, LowpError> {
    let path = dir.join("state.json");
    let text = std::fs::read_to_string(&path).map_err(|e| LowpError::file(&path, e))?;
    serde_json::from_str(&text).map_err(|e| LowpError::file(&path, e))
}

/// Loads the model and optimizer records of `dir` into `model` and `optim` (of an
/// expert-parallel checkpoint, those of EP rank `ep_rank`), and the stochastic-rounding positions
/// of `state`.
pub fn restore<B, O>(
    dir: &Path,
    model: MoeLm<B>,
    optim: O,
    state: &CheckpointState,
    ep_rank: Option<usize>,
    device: &B::Device,
) -> Result<(MoeLm<B>, O), LowpError>
where
    B: AutodiffBackend,
    O: Optimizer<MoeLm<B>, B>,
{
    let records = match ep_rank {
        Some(r) => shard_dir(dir, r),
        None => dir.to_path_buf(),
    };
    if !records.join("model.bin").is_file() {
        return Err(LowpError::file(
            records.join("model.bin"),
            match ep_rank {
                Some(_) => "missing: not an expert-parallel checkpoint of this expert_parallel_size",
                None => "missing: not a checkpoint of a run without expert parallelism",
            },
        ));
    }
    let record = recorder()
        .load(records.join("model"), device)
        .map_err(|e| LowpError::file(records.join("model.bin"), e))?;
    // The record's floats load in the backend's float type; the parameters of another dtype get
    // their saved values back, bit for bit, from `exact-params`.
    let exact: Vec<ExactParam<B, 1>> = recorder()
        .load(records.join(EXACT_PARAMS), device)
        .map_err(|e| LowpError::file(records.join(format!("{EXACT_PARAMS}.bin")), e))?;
    let model = restore_exact_params(model.load_record(record), exact)
        .map_err(|e| LowpError::file(records.join(format!("{EXACT_PARAMS}.bin")), e))?;
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
        .load(records.join("optimizer"), device)
        .map_err(|e| LowpError::file(records.join("optimizer.bin"), e))?;
    Ok((model, optim.load_record(record)))
}

/// The file of the parameters whose dtype is not the backend's float type.
const EXACT_PARAMS: &str = "exact-params";
