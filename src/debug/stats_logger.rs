//! The statistics log's writer thread. Turning a sampling step's statistics into log lines means
//! waiting for their device reads, merging micro-batches and writing JSON: about 2 ms per step on
//! the MoE example (MEASUREMENTS.md, "Precision debugging on the MoE example"), all of it host
//! time of a host-bound training step when done on the training thread. `DebugSession::step`
//! hands the finished iterations' pending statistics to this thread instead; `wait` (the session's
//! `finish`) returns once everything handed over is written and flushed. A failure on the thread
//! (a read or a write) is kept and returned by the next `log` or `wait`.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::sync::mpsc::{channel, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use serde::Serialize;

use super::config::{QuantizedStat, TensorKind, TensorStat};
use super::session::{write_line, PendingStats, ScaleDecode, StatsRead};
use super::stats::TensorStats;
use crate::error::{LowpError, Result};

enum Message {
    /// Pending statistics of whole iterations (every micro-batch of each).
    Log(Vec<PendingStats>),
    /// Answer on the channel once everything before this message is written and flushed.
    Flushed(Sender<()>),
}

/// The writer thread of `debug_stats-rank<r>.jsonl`.
pub(crate) struct StatsLogger {
    sender: Option<Sender<Message>>,
    thread: Option<JoinHandle<()>>,
    failure: Arc<Mutex<Option<LowpError>>>,
}

impl StatsLogger {
    pub(crate) fn new(mut out: BufWriter<File>) -> Self {
        let (sender, receiver) = channel::<Message>();
        let failure = Arc::new(Mutex::new(None));
        let failed = failure.clone();
        let thread = std::thread::Builder::new()
            .name("lowp-debug-stats".into())
            .spawn(move || {
                for message in receiver {
                    match message {
                        Message::Log(ready) => {
                            if let Err(e) = write_stats(&mut out, ready) {
                                failed.lock().unwrap_or_else(|p| p.into_inner()).get_or_insert(e);
                            }
                        }
                        Message::Flushed(done) => {
                            let _ = done.send(());
                        }
                    }
                }
            })
            .expect("spawning the debug statistics logger thread");
        StatsLogger {
            sender: Some(sender),
            thread: Some(thread),
            failure,
        }
    }

    fn failure(&self) -> Result<()> {
        match self.failure.lock().unwrap_or_else(|p| p.into_inner()).take() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    fn send(&self, message: Message) -> Result<()> {
        let stopped = || LowpError::invalid("debug statistics logger", "stopped", "its thread ended early");
        self.sender.as_ref().ok_or_else(stopped)?.send(message).map_err(|_| stopped())
    }

    /// Hands `ready` to the thread; reports an earlier failure of the thread, if any.
    pub(crate) fn log(&self, ready: Vec<PendingStats>) -> Result<()> {
        self.failure()?;
        if !ready.is_empty() {
            self.send(Message::Log(ready))?;
        }
        Ok(())
    }

    /// Waits until everything handed over is written and flushed.
    pub(crate) fn wait(&self) -> Result<()> {
        let (done, finished) = channel();
        self.send(Message::Flushed(done))?;
        finished.recv().map_err(|_| {
            LowpError::invalid("debug statistics logger", "stopped", "its thread ended before flushing")
        })?;
        self.failure()
    }
}

impl Drop for StatsLogger {
    fn drop(&mut self) {
        // Closing the channel ends the thread's loop once it has written what it holds.
        self.sender.take();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

#[derive(Serialize)]
struct StatRecord<'a> {
    iteration: u64,
    layer: &'a str,
    tensor: &'a str,
    stat: &'a str,
    value: f64,
}

#[derive(Clone, Copy)]
enum StatKind {
    Tensor(TensorStat),
    Quantized(QuantizedStat),
}

/// Logs `ready`, micro-batches of one (iteration, layer, tensor, statistic) accumulated, and
/// flushes the log.
fn write_stats(out: &mut BufWriter<File>, ready: Vec<PendingStats>) -> Result<()> {
    // (iteration, layer, tensor, name) -> (accumulated stats, how to turn them into values)
    let mut merged: BTreeMap<(u64, String, TensorKind, String), (TensorStats, Vec<f64>)> =
        BTreeMap::new();
    let mut order: Vec<(u64, String, TensorKind, String, StatKind)> = Vec::new();
    for p in ready {
        let buffers = (p.read)()?;
        let stats = TensorStats::from_partial_bytes(&buffers[0]);
        if stats.numel == 0 {
            // An expert that got no tokens this micro-batch: nothing to report.
            continue;
        }
        let mut push = |name: String, kind: StatKind, scale_values: Vec<f64>| {
            let key = (p.iteration, p.layer.clone(), p.tensor, name.clone());
            match merged.get_mut(&key) {
                Some((acc, scales)) => {
                    acc.merge(&stats);
                    scales.extend(scale_values);
                }
                None => {
                    merged.insert(key, (stats, scale_values));
                    order.push((p.iteration, p.layer.clone(), p.tensor, name, kind));
                }
            }
        };
        match &p.what {
            StatsRead::Tensor(list) => {
                for s in list {
                    push(stat_name(s), StatKind::Tensor(*s), Vec::new());
                }
            }
            StatsRead::Quantized {
                stats: list,
                prefix,
                suffix,
                scales,
            } => {
                let scale_values = match (scales, buffers.get(1)) {
                    (Some(decode), Some(bytes)) => decode_scales(*decode, bytes),
                    _ => Vec::new(),
                };
                for s in list {
                    if matches!(s, QuantizedStat::ScaleInvMin | QuantizedStat::ScaleInvMax)
                        && scales.is_none()
                    {
                        continue;
                    }
                    let name = format!("{prefix}{}{suffix}", quantized_stat_name(s));
                    push(name, StatKind::Quantized(*s), scale_values.clone());
                }
            }
        }
    }
    for (iteration, layer, tensor, name, kind) in order {
        let (stats, scales) = &merged[&(iteration, layer.clone(), tensor, name.clone())];
        let value = match kind {
            StatKind::Tensor(s) => stats.stat(s),
            StatKind::Quantized(QuantizedStat::ScaleInvMin) => {
                scales.iter().copied().filter(|v| *v > 0.0).fold(f64::INFINITY, f64::min)
            }
            StatKind::Quantized(QuantizedStat::ScaleInvMax) => {
                scales.iter().copied().fold(0.0, f64::max)
            }
            StatKind::Quantized(s) => stats.quantized_stat(s).unwrap_or(f64::NAN),
        };
        let record = StatRecord {
            iteration,
            layer: &layer,
            tensor: tensor.name(),
            stat: &name,
            value,
        };
        write_line(out, &record)?;
    }
    out.flush().map_err(|e| LowpError::file("debug_stats log", e))
}

fn stat_name(s: &TensorStat) -> String {
    serde_json::to_value(s)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default()
}

fn quantized_stat_name(s: &QuantizedStat) -> String {
    serde_json::to_value(s)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default()
}

fn decode_scales(decode: ScaleDecode, bytes: &[u8]) -> Vec<f64> {
    match decode {
        ScaleDecode::F32 => bytes
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]) as f64)
            .collect(),
        // Padding cells are zero bytes; a real E8M0 scale of 2^-127 does not occur.
        ScaleDecode::E8m0 => bytes
            .iter()
            .filter(|&&e| e != 0)
            .map(|&e| crate::format::codec::e8m0_to_f32(e) as f64)
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::debug::config::TensorStat;

    /// A read that failed on the logger thread is reported by `wait`, with its message, and the
    /// logger keeps going for later batches.
    #[test]
    fn a_failed_read_on_the_thread_is_reported_by_wait() {
        let dir = tempfile::tempdir().unwrap();
        let out = BufWriter::new(File::create(dir.path().join("stats.jsonl")).unwrap());
        let logger = StatsLogger::new(out);
        let failing = PendingStats {
            iteration: 3,
            layer: "fc1".into(),
            tensor: TensorKind::Activation,
            what: StatsRead::Tensor(vec![TensorStat::Max]),
            read: Box::new(|| Err(LowpError::invalid("statistics buffer", "unreadable", "the device read failed"))),
        };
        logger.log(vec![failing]).unwrap();
        let err = logger.wait().unwrap_err().to_string();
        assert!(err.contains("statistics buffer") && err.contains("device read failed"), "{err}");
        // Reported once; an empty log after it is fine.
        logger.log(Vec::new()).unwrap();
        logger.wait().unwrap();
    }
}
