//! A debug session: the config, the iteration counter, the AutoswitchGemm switches and the logs of
//! one training process (one rank). It is installed on the thread that trains (`install`), as TE's
//! `debug_api.initialize`; modules look it up when they build a GEMM's op, so a model gets debug
//! tools without code changes, and without a session (or for layers no section selects) nothing
//! is computed: one thread-local read per op.
//!
//! Statistics are computed on the device and copied to the host asynchronously
//! (`BytesOps::bytes_to_host_later`); `step()` hands those of earlier iterations (one step
//! late, so the copies have landed and logging never stalls the GPU) to a logger thread
//! (`stats_logger`), which reduces and writes them off the training thread, and `finish()` the
//! rest, waiting until they are written.
//! AutoswitchGemm's same-iteration decisions read their metrics when the GEMM is about to run:
//! one blocking read per monitored GEMM and sampling iteration, counted in `host_syncs()`
//! (`debug_metric_reads`); `timing: next_sample` uses the previous sample's metrics instead and
//! never blocks.
//!
//! Logs (JSON lines, in `log_dir`): `debug_stats-rank<r>.jsonl`, one record per (iteration,
//! layer, tensor, statistic); `autoswitch-rank<r>.jsonl`, one record per sample and per
//! high-precision GEMM.

use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use serde::Serialize;

use super::autoswitch::{Breach, GemmMetrics, SwitchEvent, SwitchState};
use super::config::{
    DebugConfig, GemmName, HighPrecisionSource, HoldScope, QuantizedStat, Section, SwitchTiming,
    TensorKind,
};
use super::stats::TensorStats;
use super::stats_logger::StatsLogger;
use crate::error::{LowpError, Result};
use crate::recipe::ModuleKind;

/// A device read whose bytes arrive later.
pub(crate) type LaterRead = Box<dyn FnOnce() -> Result<Vec<Vec<u8>>> + Send>;

/// What a pending statistics read turns into.
#[derive(Clone)]
pub(crate) enum StatsRead {
    /// `LogTensorStats` on the high-precision tensor.
    Tensor(Vec<super::config::TensorStat>),
    /// `LogQuantizedTensorStats` of one representation; names `<prefix><stat><suffix>`.
    Quantized {
        stats: Vec<QuantizedStat>,
        prefix: String,
        suffix: &'static str,
        /// How to decode the scale bytes (the second buffer of the read), if scale stats apply.
        scales: Option<ScaleDecode>,
    },
}

/// How a representation's scale bytes decode to `scale_inv` values.
#[derive(Debug, Clone, Copy)]
pub(crate) enum ScaleDecode {
    F32,
    E8m0,
}

pub(crate) struct PendingStats {
    pub iteration: u64,
    pub layer: String,
    pub tensor: TensorKind,
    pub what: StatsRead,
    pub read: LaterRead,
}

/// A metric read of AutoswitchGemm: one tensor's copy feeding one GEMM.
struct PendingMetric {
    tensor: TensorKind,
    read: LaterRead,
}

/// One line of the AutoswitchGemm log.
#[derive(Serialize, serde::Deserialize, Debug, Clone, PartialEq)]
pub struct SwitchRecord {
    pub iteration: u64,
    pub layer: String,
    pub gemm: GemmName,
    /// `sample` (metrics of a sampling iteration, with `event`) or `high_precision` (the GEMM ran
    /// in high precision this iteration).
    pub kind: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub event: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metrics: Option<serde_json::Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trigger: Option<serde_json::Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disable_until: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
}

/// Switch counts of one (layer, GEMM) for the end-of-run summary.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SwitchTally {
    pub samples: u64,
    pub switches: u64,
    pub releases: u64,
    pub high_precision_iterations: u64,
    /// The worst sample: (underflow %, its tensor, iteration) and (MSE, its tensor, iteration).
    pub worst_underflow: Option<(f64, TensorKind, u64)>,
    pub worst_mse: Option<(f64, TensorKind, u64)>,
}

struct SwitchSlot {
    state: SwitchState,
    /// The iteration whose sample was applied last (a GEMM runs once per micro-batch).
    applied: Option<u64>,
    /// Metrics observed per sampling iteration, not yet used.
    metrics: BTreeMap<u64, Vec<PendingMetric>>,
    /// The iteration a high-precision record was written for last.
    logged_hp: Option<u64>,
}

struct State {
    iteration: u64,
    pending: Vec<PendingStats>,
    switches: HashMap<(String, GemmName), SwitchSlot>,
    tallies: BTreeMap<(String, GemmName), SwitchTally>,
    global_until: Option<u64>,
    /// Writes `debug_stats-rank<r>.jsonl` on a thread of its own.
    stats_logger: StatsLogger,
    /// Whether this iteration computed statistics or AutoswitchGemm metrics (a sampling step).
    observed: bool,
    switch_log: BufWriter<File>,
}

/// The debug tools of one process (rank).
pub struct DebugSession {
    config: DebugConfig,
    log_dir: PathBuf,
    rank: usize,
    state: Mutex<State>,
}

thread_local! {
    static ACTIVE: RefCell<Option<Arc<DebugSession>>> = const { RefCell::new(None) };
}

/// Uninstalls the session when dropped.
pub struct Installed {
    previous: Option<Arc<DebugSession>>,
}

impl Drop for Installed {
    fn drop(&mut self) {
        let previous = self.previous.take();
        ACTIVE.with(|a| *a.borrow_mut() = previous);
    }
}

/// The session installed on this thread.
pub fn active() -> Option<Arc<DebugSession>> {
    ACTIVE.with(|a| a.borrow().clone())
}

fn file(path: &Path) -> Result<BufWriter<File>> {
    File::create(path)
        .map(BufWriter::new)
        .map_err(|e| LowpError::file(path, format!("cannot be created: {e}")))
}

impl DebugSession {
    /// A session logging into `log_dir` (created) as `rank`, starting at iteration 0.
    pub fn new(config: DebugConfig, log_dir: impl AsRef<Path>, rank: usize) -> Result<Arc<Self>> {
        let log_dir = log_dir.as_ref().to_path_buf();
        std::fs::create_dir_all(&log_dir)
            .map_err(|e| LowpError::file(&log_dir, format!("cannot be created: {e}")))?;
        let stats_log = file(&log_dir.join(format!("debug_stats-rank{rank}.jsonl")))?;
        let switch_log = file(&log_dir.join(format!("autoswitch-rank{rank}.jsonl")))?;
        Ok(Arc::new(DebugSession {
            config,
            log_dir,
            rank,
            state: Mutex::new(State {
                iteration: 0,
                pending: Vec::new(),
                switches: HashMap::new(),
                tallies: BTreeMap::new(),
                global_until: None,
                stats_logger: StatsLogger::new(stats_log),
                observed: false,
                switch_log,
            }),
        }))
    }

    /// Makes this the session of the current thread until the guard drops.
    pub fn install(self: &Arc<Self>) -> Installed {
        let previous = ACTIVE.with(|a| a.borrow_mut().replace(self.clone()));
        Installed { previous }
    }

    pub fn config(&self) -> &DebugConfig {
        &self.config
    }

    pub fn log_dir(&self) -> &Path {
        &self.log_dir
    }

    pub fn rank(&self) -> usize {
        self.rank
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Starts counting at `iteration` (a resumed run; TE's `NVTE_DEBUG_ITERATION_OFFSET`).
    pub fn set_iteration(&self, iteration: u64) {
        self.lock().iteration = iteration;
    }

    /// The current iteration.
    pub fn iteration(&self) -> u64 {
        self.lock().iteration
    }

    /// Ends an iteration (TE's `debug_api.step()`, after the optimizer step): statistics of
    /// earlier iterations are logged, and the next iteration begins.
    pub fn step(&self) -> Result<()> {
        let mut state = self.lock();
        let done = state.iteration;
        state.iteration += 1;
        state.observed = false;
        Self::flush_stats(&mut state, Some(done))?;
        // Metrics a next-sample decision will never use (older than the last sample) go.
        for slot in state.switches.values_mut() {
            while slot.metrics.len() > 2 {
                let first = *slot.metrics.keys().next().unwrap();
                slot.metrics.remove(&first);
            }
        }
        Ok(())
    }

    /// Logs every pending statistic and flushes the logs (the end of a run).
    pub fn finish(&self) -> Result<()> {
        let mut state = self.lock();
        Self::flush_stats(&mut state, None)?;
        state.stats_logger.wait()
    }

    /// Whether the current iteration has computed statistics or AutoswitchGemm metrics so far
    /// (asked before `step()`: whether this was a sampling step).
    pub fn observed_this_iteration(&self) -> bool {
        self.lock().observed
    }

    /// Per (layer, GEMM): samples, switches and the worst metrics so far.
    pub fn switch_tallies(&self) -> BTreeMap<(String, GemmName), SwitchTally> {
        self.lock().tallies.clone()
    }

    /// Hands the pending statistics of iterations before `before` (all with `None`) to the
    /// logger thread, and flushes the AutoswitchGemm log.
    fn flush_stats(state: &mut State, before: Option<u64>) -> Result<()> {
        let (ready, waiting): (Vec<_>, Vec<_>) = std::mem::take(&mut state.pending)
            .into_iter()
            .partition(|p| before.is_none_or(|b| p.iteration < b));
        state.pending = waiting;
        state.stats_logger.log(ready)?;
        state
            .switch_log
            .flush()
            .map_err(|e| LowpError::file("autoswitch log", e))
    }

    pub(crate) fn push_stats(&self, pending: PendingStats) {
        let mut state = self.lock();
        state.observed = true;
        state.pending.push(pending);
    }

    pub(crate) fn push_metric(
        &self,
        layer: &str,
        gemm: GemmName,
        iteration: u64,
        tensor: TensorKind,
        read: LaterRead,
    ) {
        let mut state = self.lock();
        state.observed = true;
        let slot = state
            .switches
            .entry((layer.to_string(), gemm))
            .or_insert_with(SwitchSlot::new);
        slot.metrics.entry(iteration).or_default().push(PendingMetric { tensor, read });
    }

    /// AutoswitchGemm's decision for `gemm` of `layer` at the current iteration: applies the
    /// sample due now (reading its metrics), logs it, and says whether the GEMM runs in high
    /// precision.
    pub(crate) fn autoswitch_high_precision(
        &self,
        section: &Section,
        layer: &str,
        gemm: GemmName,
    ) -> Result<bool> {
        let Some(config) = &section.features.autoswitch_gemm else {
            return Ok(false);
        };
        if !config.gemms.contains(&gemm) {
            return Ok(false);
        }
        let schedule = config.schedule();
        let mut state = self.lock();
        let it = state.iteration;
        let key = (layer.to_string(), gemm);
        let slot = state.switches.entry(key.clone()).or_insert_with(SwitchSlot::new);
        let mut sample: Option<(GemmMetrics, SwitchEvent, Option<Breach>, u64)> = None;
        if schedule.samples(it) && slot.applied != Some(it) {
            slot.applied = Some(it);
            // The metrics to decide with: this iteration's, or the previous sample's.
            let source = match config.timing {
                SwitchTiming::SameIteration => slot.metrics.remove(&it).map(|m| (it, m)),
                SwitchTiming::NextSample => {
                    let earlier = slot.metrics.range(..it).next_back().map(|(k, _)| *k);
                    earlier.and_then(|k| slot.metrics.remove(&k).map(|m| (k, m)))
                }
            };
            if let Some((measured_at, reads)) = source {
                let mut tensors = Vec::with_capacity(reads.len());
                for m in reads {
                    let started = Instant::now();
                    let buffers = (m.read)()?;
                    crate::backend::host_sync::record_debug_metric_read(started.elapsed());
                    let stats = TensorStats::from_partial_bytes(&buffers[0]);
                    // (An expert without tokens in a micro-batch measured nothing there.)
                    if stats.numel > 0 {
                        tensors.push((m.tensor, stats.quantization_error(), stats.relative_mse()));
                    }
                }
                if let Some(metrics) = GemmMetrics::worst(&tensors) {
                    let (event, breach) = slot.state.apply_sample(it, schedule.freq, &metrics, config);
                    sample = Some((metrics, event, breach, measured_at));
                }
            }
        }
        let own = slot.state.high_precision_at(it);
        let until = slot.state.disable_until;
        let log_hp = slot.logged_hp != Some(it);
        if own && config.hold_window_scope == HoldScope::Global {
            state.global_until = state.global_until.max(until);
        }
        let high = own
            || (config.hold_window_scope == HoldScope::Global
                && state.global_until.is_some_and(|u| it <= u));
        if let Some((metrics, event, breach, measured_at)) = sample {
            let tally = state.tallies.entry(key.clone()).or_default();
            tally.samples += 1;
            match event {
                SwitchEvent::Switch => tally.switches += 1,
                SwitchEvent::Release => tally.releases += 1,
                _ => {}
            }
            let worse = |old: Option<(f64, TensorKind, u64)>, v: f64, t: TensorKind| match old {
                Some((o, _, _)) if o >= v => old,
                _ => Some((v, t, measured_at)),
            };
            tally.worst_underflow = worse(tally.worst_underflow, metrics.underflow_pct, metrics.underflow_tensor);
            tally.worst_mse = worse(tally.worst_mse, metrics.mse, metrics.mse_tensor);
            let record = SwitchRecord {
                iteration: it,
                layer: layer.to_string(),
                gemm,
                kind: "sample".into(),
                event: Some(
                    serde_json::to_value(event)
                        .ok()
                        .and_then(|v| v.as_str().map(str::to_string))
                        .unwrap_or_default(),
                ),
                metrics: serde_json::to_value(serde_json::json!({
                    "measured_at": measured_at,
                    "underflow_pct": metrics.underflow_pct,
                    "underflow_tensor": metrics.underflow_tensor,
                    "mse": metrics.mse,
                    "mse_tensor": metrics.mse_tensor,
                    "relative_mse": metrics.relative_mse,
                }))
                .ok(),
                trigger: breach.and_then(|b| serde_json::to_value(b).ok()),
                disable_until: until,
                source: None,
            };
            write_line(&mut state.switch_log, &record)?;
        }
        if high && log_hp {
            let slot = state.switches.get_mut(&key).expect("slot made above");
            slot.logged_hp = Some(it);
            state.tallies.entry(key).or_default().high_precision_iterations += 1;
            let record = SwitchRecord {
                iteration: it,
                layer: layer.to_string(),
                gemm,
                kind: "high_precision".into(),
                event: None,
                metrics: None,
                trigger: None,
                disable_until: until.or(state.global_until),
                source: Some(
                    match config.high_precision_source {
                        HighPrecisionSource::Dequantized => "dequantized",
                        HighPrecisionSource::Original => "original",
                    }
                    .into(),
                ),
            };
            write_line(&mut state.switch_log, &record)?;
        }
        Ok(high)
    }

    /// Whether AutoswitchGemm may switch a GEMM of `layer` at the current iteration (a sample is
    /// due, or a hold window is open): the op must then keep what a high-precision GEMM reads.
    pub(crate) fn autoswitch_may_act(&self, section: &Section, layer: &str) -> bool {
        let Some(config) = &section.features.autoswitch_gemm else {
            return false;
        };
        let state = self.lock();
        let it = state.iteration;
        config.schedule().samples(it)
            || (config.hold_window_scope == HoldScope::Global
                && state.global_until.is_some_and(|u| it <= u))
            || {
                // The layer itself or, for a grouped layer, one of its experts.
                let experts = format!("{layer}.gemm_");
                state.switches.iter().any(|((l, g), s)| {
                    (l == layer || l.starts_with(&experts))
                        && config.gemms.contains(g)
                        && s.state.high_precision_at(it)
                })
            }
    }

    /// The enabled section that selects a layer, if any.
    pub fn section_for(&self, name: &str, kind: &ModuleKind) -> Result<Option<&Section>> {
        Ok(self.config.section_for(name, kind)?.map(|(_, s)| s))
    }
}

impl SwitchSlot {
    fn new() -> Self {
        SwitchSlot {
            state: SwitchState::default(),
            applied: None,
            metrics: BTreeMap::new(),
            logged_hp: None,
        }
    }
}

pub(super) fn write_line(out: &mut BufWriter<File>, record: &impl Serialize) -> Result<()> {
    let line = serde_json::to_string(record)
        .map_err(|e| LowpError::invalid("debug log record", "JSON", e.to_string()))?;
    writeln!(out, "{line}").map_err(|e| LowpError::file("debug log", e))
}
