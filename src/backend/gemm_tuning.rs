//! The GEMM algorithms chosen by timing, kept in a file so that later runs reuse them.
//!
//! On CUDA the first GEMM of a shape times cuBLASLt's candidate algorithms and keeps the fastest
//! (`cublaslt::CublasLt::choose_algo`). Candidates often run within a few per cent of each other,
//! so two runs of one program can keep different algorithms for a shape; they sum in different
//! orders, and the runs drift apart: measured on an H100, five 150-step runs of the MoE example
//! ended at three different losses, their choices differing in 10-13 of 21 shapes
//! (`benches/results/gemm-autotune-determinism-h100/`). A tuning file fixes the choices: loaded
//! before the GEMMs run (`load_gemm_tuning`), it gives each shape it holds its algorithm without
//! timing (no host wait either); `save_gemm_tuning` writes every choice of the process. With the
//! same file, runs of one program on one GPU model and cuBLASLt version repeat bit for bit, and a
//! resumed training run continues as the uninterrupted one did (the MoE example keeps the file
//! beside its checkpoints). `LOWP_GEMM_AUTOTUNE=0` (the heuristic's first choice, as Transformer
//! Engine does) is deterministic too, at the speed the heuristic gives.
//!
//! Entries are keyed by the GPU's name, the cuBLASLt version and the GEMM's plan (shape, types,
//! layouts, epilogue): a file made elsewhere simply matches nothing there, and one file may hold
//! several GPUs' choices. An algorithm is cuBLASLt's opaque `cublasLtMatmulAlgo_t` (eight 64-bit
//! words), checked by cuBLASLt (`cublasLtMatmulAlgoCheck`) before use.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Mutex;

use serde::{Deserialize, Serialize};

use crate::error::{LowpError, Result};

/// What identifies the file's format.
const FORMAT: &str = "burn-lowp GEMM tuning 1";

/// One cuBLASLt algorithm: the words of its `cublasLtMatmulAlgo_t`.
pub type AlgoWords = [u64; 8];

#[derive(Debug, Default, Clone, PartialEq, Serialize, Deserialize)]
struct TuningFile {
    format: String,
    /// Key (GPU, cuBLASLt version, plan) -> algorithm.
    algorithms: BTreeMap<String, AlgoWords>,
}

/// The process's choices: loaded from files, then added to as shapes are timed.
static CHOICES: Mutex<BTreeMap<String, AlgoWords>> = Mutex::new(BTreeMap::new());

fn choices() -> std::sync::MutexGuard<'static, BTreeMap<String, AlgoWords>> {
    CHOICES.lock().unwrap_or_else(|p| p.into_inner())
}

/// Adds the choices of the tuning file at `path` to the process's (they win over choices made
/// before; shapes not in the file are timed as usual). Returns how many entries the file holds.
/// A missing, unreadable or malformed file is an error naming it.
pub fn load_gemm_tuning(path: impl AsRef<Path>) -> Result<usize> {
    let path = path.as_ref();
    let text = std::fs::read_to_string(path).map_err(|e| LowpError::file(path, e))?;
    let file: TuningFile = serde_json::from_str(&text).map_err(|e| LowpError::file(path, e))?;
    if file.format != FORMAT {
        return Err(LowpError::file(
            path,
            format!("format {:?}: a GEMM tuning file has format {FORMAT:?}", file.format),
        ));
    }
    let count = file.algorithms.len();
    choices().extend(file.algorithms);
    Ok(count)
}

/// Writes every choice of the process (loaded and timed) to `path` (replacing it; written to a
/// temporary file and renamed, so an interrupted save leaves the previous file). Returns how many.
pub fn save_gemm_tuning(path: impl AsRef<Path>) -> Result<usize> {
    let path = path.as_ref();
    let file = TuningFile {
        format: FORMAT.to_string(),
        algorithms: choices().clone(),
    };
    let json = serde_json::to_string_pretty(&file).expect("a tuning table serializes");
    let staging = path.with_extension("json.saving");
    std::fs::write(&staging, json).map_err(|e| LowpError::file(&staging, e))?;
    std::fs::rename(&staging, path).map_err(|e| LowpError::file(path, e))?;
    Ok(file.algorithms.len())
}

/// The choice for `key`, if a file or an earlier timing made one.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub(crate) fn tuned(key: &str) -> Option<AlgoWords> {
    choices().get(key).copied()
}

/// Records the algorithm timing chose for `key`.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub(crate) fn record_tuned(key: String, algo: AlgoWords) {
    choices().insert(key, algo);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tuning_files_round_trip_and_bad_ones_are_named_errors() {
        let dir = std::env::temp_dir().join(format!("lowp-tuning-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("tuning.json");
        let key = "test GPU cublasLt 1 PlanKey { m: 7 }".to_string();
        let algo = [1, 2, 3, u64::MAX, 5, 6, 7, 8];
        record_tuned(key.clone(), algo);
        assert!(save_gemm_tuning(&path).unwrap() >= 1);
        // A fresh value under the same key, then the file's wins again on load.
        record_tuned(key.clone(), [0; 8]);
        assert!(load_gemm_tuning(&path).unwrap() >= 1);
        assert_eq!(tuned(&key), Some(algo));
        assert_eq!(tuned("a shape nobody timed"), None);

        let missing = load_gemm_tuning(dir.join("missing.json")).unwrap_err().to_string();
        assert!(missing.contains("missing.json"), "{missing}");
        std::fs::write(&path, "{\"format\": \"something else\", \"algorithms\": {}}").unwrap();
        let wrong = load_gemm_tuning(&path).unwrap_err().to_string();
        assert!(wrong.contains("tuning.json") && wrong.contains("something else"), "{wrong}");
        std::fs::write(&path, "not json").unwrap();
        let garbled = load_gemm_tuning(&path).unwrap_err().to_string();
        assert!(garbled.contains("tuning.json"), "{garbled}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
