//! What a run measured (`<out>/<label>/summary.json`, a line of `metrics.jsonl` per logged
//! step), reading the runs of an output directory back, and the results table comparing them.

use std::fmt::Write as _;
use std::path::Path;

use burn_lowp::error::LowpError;
use serde::{Deserialize, Serialize};

/// One logged step.
#[derive(Debug, Clone, Serialize)]
pub struct StepMetrics {
    pub step: usize,
    pub loss: f32,
    pub aux_loss: f32,
    pub lr: f64,
    /// Average over the log interval this step closes (wall clock, after the interval's sync).
    pub step_ms: f64,
    pub tokens_per_s: f64,
}

/// What a run measured (`<out>/<label>/summary.json`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RunSummary {
    pub label: String,
    pub num_params: usize,
    pub first_step: usize,
    pub steps: usize,
    /// Language-model loss of every step this process ran, in order.
    pub losses: Vec<f32>,
    /// Mean loss of the last 10 % of steps (at least one).
    pub final_loss: f32,
    /// Mean loss on the held-out batches after training.
    pub eval_loss: f32,
    /// Throughput over the log intervals after the first (which includes autotuning and
    /// allocation), or over all of them when there is only one.
    pub tokens_per_s: f64,
    pub step_ms: f64,
    /// Host reads of grouped-GEMM splits per step, and how many of them waited for the GPU.
    pub split_reads_per_step: f64,
    pub blocking_split_reads_per_step: f64,
    /// Pointer-array expert GEMMs per step that found the splits' host copy arrived (and ran the
    /// chunks the splits fill), and those that ran the host-known bound of chunks.
    #[serde(default)]
    pub exact_batches_per_step: f64,
    #[serde(default)]
    pub bound_batches_per_step: f64,
    /// Graph-safe expert GEMMs per step that ran our Hopper grouped GEMM instead of a bound
    /// batch (`backend::sm90_grouped`, the default on sm_90 GPUs).
    #[serde(default)]
    pub device_grouped_batches_per_step: f64,
    /// Expert weight gradients per step that ran our K-grouped kernel instead of one GEMM per
    /// expert (`backend::cuda::sm90_wgrad`, BF16 on sm_90 GPUs).
    #[serde(default)]
    pub device_grouped_wgrads_per_step: f64,
    pub peak_memory_bytes: Option<u64>,
    /// Tokens per expert, summed over layers and the run's last step (load balance).
    pub last_loads: Vec<i64>,
    /// With a debug config: AutoswitchGemm metric reads per step, and how many waited for the GPU.
    #[serde(default)]
    pub debug_metric_reads_per_step: f64,
    #[serde(default)]
    pub blocking_debug_metric_reads_per_step: f64,
    /// Host time per step spent in the step's code (forward, backward, optimizer: enqueueing
    /// work, plus any host read that waited), over the timed steps.
    #[serde(default)]
    pub host_ms_per_step: f64,
    /// `host_ms_per_step` split by phase: the micro-batches' forward passes, their backward
    /// passes (with gradient accumulation), and the optimizer step.
    #[serde(default)]
    pub host_phase_ms_per_step: HostPhases,
    /// With `sync_every_step`: how long the host then waited for the GPU to finish the step.
    /// Near zero: the GPU finished the step's work before the host finished enqueueing it (the
    /// step is host-bound, and its GPU time is at most `host_ms_per_step`); otherwise the GPU
    /// time is about `host_ms_per_step + sync_wait_ms_per_step`.
    #[serde(default)]
    pub sync_wait_ms_per_step: Option<f64>,
    /// With a debug config: what the debug tools cost, measured inside this run.
    #[serde(default)]
    pub debug_step_cost: Option<DebugStepCost>,
}

/// The debug tools' cost measured inside one run, from the host time of its timed steps (the
/// step is host-bound, so its host time is its time). A sampling step computes statistics and
/// metrics; the step after it hands their reads to the logger; the others ("clean") run as they
/// would without a debug config. Comparing steps of one run avoids the drift of 5-10 % between
/// runs of one configuration on the GPU machine, which is larger than the cost measured.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DebugStepCost {
    pub sampled_steps: usize,
    pub sampled_host_ms: f64,
    pub after_sampled_host_ms: f64,
    pub clean_steps: usize,
    pub clean_host_ms: f64,
    /// The timed steps' host time over what it would be at `clean_host_ms` per step, minus one
    /// (`None` without clean steps).
    pub overhead: Option<f64>,
}

impl DebugStepCost {
    /// From each step's host seconds and whether it was a sampling step.
    pub fn from_steps(host_seconds: &[f64], sampled: &[bool]) -> Self {
        let mean_ms = |v: &[f64]| if v.is_empty() { 0.0 } else { 1e3 * v.iter().sum::<f64>() / v.len() as f64 };
        let (mut on, mut after, mut clean) = (Vec::new(), Vec::new(), Vec::new());
        for (i, (&t, &s)) in host_seconds.iter().zip(sampled).enumerate() {
            match (s, i > 0 && sampled[i - 1]) {
                (true, _) => on.push(t),
                (false, true) => after.push(t),
                (false, false) => clean.push(t),
            }
        }
        let clean_host_ms = mean_ms(&clean);
        let steps = on.len() + after.len() + clean.len();
        let total_ms = 1e3 * (on.iter().chain(&after).chain(&clean).sum::<f64>());
        DebugStepCost {
            sampled_steps: on.len(),
            sampled_host_ms: mean_ms(&on),
            after_sampled_host_ms: mean_ms(&after),
            clean_steps: clean.len(),
            clean_host_ms,
            overhead: (!clean.is_empty()).then(|| total_ms / (steps as f64 * clean_host_ms) - 1.0),
        }
    }
}

/// Host milliseconds per step in each phase of the step's code.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct HostPhases {
    pub forward: f64,
    pub backward: f64,
    pub optimizer: f64,
    /// With a debug config: the debug session's end of step (handing the statistics of the last
    /// sampling step to its logger thread, which reads, reduces and writes them).
    #[serde(default)]
    pub debug_log: f64,
}

/// The results table as Markdown: one row per run; speed-up and loss gap against the first run
/// (or the run labelled `bf16` when there is one).
pub fn results_table(runs: &[RunSummary]) -> String {
    let base = runs.iter().find(|r| r.label == "bf16").or(runs.first());
    let mut out = String::from(
        "| recipe | final loss | vs base | held-out loss | vs base | tokens/s | speed-up | ms/step | split reads/step (blocking) | peak pool memory |\n\
         |---|---|---|---|---|---|---|---|---|---|\n",
    );
    for r in runs {
        let (gap, eval_gap, speed) = match base {
            Some(b) => (
                100.0 * (r.final_loss / b.final_loss - 1.0),
                100.0 * (r.eval_loss / b.eval_loss - 1.0),
                r.tokens_per_s / b.tokens_per_s,
            ),
            None => (0.0, 0.0, 1.0),
        };
        let memory = r
            .peak_memory_bytes
            .map(|b| format!("{:.2} GiB", b as f64 / (1u64 << 30) as f64))
            .unwrap_or_else(|| "-".into());
        let _ = writeln!(
            out,
            "| {} | {:.4} | {:+.2} % | {:.4} | {:+.2} % | {:.0} | {:.2}x | {:.1} | {:.2} ({:.2}) | {} |",
            r.label,
            r.final_loss,
            gap,
            r.eval_loss,
            eval_gap,
            r.tokens_per_s,
            speed,
            r.step_ms,
            r.split_reads_per_step,
            r.blocking_split_reads_per_step,
            memory
        );
    }
    out
}

/// The summaries of the runs under `out` (`<out>/<label>/summary.json`), bf16 first, then by name.
pub fn read_summaries(out: &Path) -> Result<Vec<RunSummary>, LowpError> {
    let entries = std::fs::read_dir(out).map_err(|e| LowpError::file(out, e))?;
    let mut summaries = Vec::new();
    for entry in entries {
        let path = entry.map_err(|e| LowpError::file(out, e))?.path().join("summary.json");
        if !path.is_file() {
            continue;
        }
        let text = std::fs::read_to_string(&path).map_err(|e| LowpError::file(&path, e))?;
        let summary: RunSummary =
            serde_json::from_str(&text).map_err(|e| LowpError::file(&path, format!("not a run summary: {e}")))?;
        summaries.push(summary);
    }
    if summaries.is_empty() {
        return Err(LowpError::file(out, "holds no runs (<out>/<recipe>/summary.json); train some first"));
    }
    summaries.sort_by(|a: &RunSummary, b: &RunSummary| (a.label != "bf16", &a.label).cmp(&(b.label != "bf16", &b.label)));
    Ok(summaries)
}

#[cfg(test)]
mod tests {
    use super::DebugStepCost;

    /// One sampling step of 30 ms, the step after it 12 ms, three clean steps of 10 ms: the five
    /// steps took 72 ms where five clean ones take 50 ms.
    #[test]
    fn debug_step_cost_compares_with_the_clean_steps_of_the_run() {
        let cost = DebugStepCost::from_steps(&[0.010, 0.030, 0.012, 0.010, 0.010], &[false, true, false, false, false]);
        assert_eq!((cost.sampled_steps, cost.clean_steps), (1, 3));
        assert!((cost.sampled_host_ms - 30.0).abs() < 1e-9);
        assert!((cost.after_sampled_host_ms - 12.0).abs() < 1e-9);
        assert!((cost.clean_host_ms - 10.0).abs() < 1e-9);
        assert!((cost.overhead.unwrap() - 0.44).abs() < 1e-9);
        assert!(DebugStepCost::from_steps(&[0.01], &[true]).overhead.is_none());
    }
}
