//! A run's debug logs read back (`lowp debug-summary DIR`, and the MoE example at the end of a
//! run): per (layer, GEMM) the AutoswitchGemm samples, switches, releases, iterations run in high
//! precision and the worst metrics with the tensor behind them; per (layer, tensor) the extremes of
//! the logged quantization statistics.

use std::collections::BTreeMap;
use std::path::Path;

use serde::Deserialize;

use super::session::SwitchRecord;
use crate::error::{LowpError, Result};

/// Switch activity of one (layer, GEMM).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GemmSummary {
    pub samples: u64,
    pub switches: u64,
    pub releases: u64,
    pub high_precision_iterations: u64,
    /// (value, tensor, iteration) of the largest sampled underflow % and MSE.
    pub worst_underflow: Option<(f64, String, u64)>,
    pub worst_mse: Option<(f64, String, u64)>,
}

/// One statistic of one (layer, tensor) over the run.
#[derive(Debug, Clone, PartialEq)]
pub struct StatSummary {
    pub records: u64,
    pub max: (f64, u64),
    pub last: (f64, u64),
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct DebugSummary {
    pub gemms: BTreeMap<(String, String), GemmSummary>,
    pub stats: BTreeMap<(String, String, String), StatSummary>,
}

#[derive(Deserialize)]
struct StatLine {
    iteration: u64,
    layer: String,
    tensor: String,
    stat: String,
    value: Option<f64>,
}

fn log_files(dir: &Path, prefix: &str) -> Result<Vec<std::path::PathBuf>> {
    let entries = std::fs::read_dir(dir).map_err(|e| LowpError::file(dir, e))?;
    let mut files: Vec<_> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(prefix) && n.ends_with(".jsonl"))
        })
        .collect();
    files.sort();
    Ok(files)
}

fn lines<T: for<'de> Deserialize<'de>>(path: &Path) -> Result<Vec<T>> {
    let text = std::fs::read_to_string(path).map_err(|e| LowpError::file(path, e))?;
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| {
            serde_json::from_str(l)
                .map_err(|e| LowpError::file(path, format!("line {}: not a debug record: {e}", i + 1)))
        })
        .collect()
}

fn metric(record: &SwitchRecord, value: &str, tensor: &str) -> Option<(f64, String, u64)> {
    let m = record.metrics.as_ref()?;
    let at = m.get("measured_at").and_then(|v| v.as_u64()).unwrap_or(record.iteration);
    Some((
        m.get(value)?.as_f64()?,
        m.get(tensor)?.as_str()?.to_string(),
        at,
    ))
}

impl DebugSummary {
    /// Reads every rank's logs in `dir`.
    pub fn read(dir: &Path) -> Result<DebugSummary> {
        let switch_files = log_files(dir, "autoswitch-rank")?;
        let stat_files = log_files(dir, "debug_stats-rank")?;
        if switch_files.is_empty() && stat_files.is_empty() {
            return Err(LowpError::file(
                dir,
                "holds no debug logs (autoswitch-rank<r>.jsonl, debug_stats-rank<r>.jsonl)",
            ));
        }
        let mut summary = DebugSummary::default();
        for path in switch_files {
            for r in lines::<SwitchRecord>(&path)? {
                let g = summary
                    .gemms
                    .entry((r.layer.clone(), r.gemm.name().to_string()))
                    .or_default();
                match r.kind.as_str() {
                    "sample" => {
                        g.samples += 1;
                        match r.event.as_deref() {
                            Some("switch") => g.switches += 1,
                            Some("release") => g.releases += 1,
                            _ => {}
                        }
                        let worse = |old: &Option<(f64, String, u64)>, new: Option<(f64, String, u64)>| {
                            match (old, new) {
                                (Some(o), Some(n)) if n.0 > o.0 => Some(n),
                                (None, n) => n,
                                (o, _) => o.clone(),
                            }
                        };
                        g.worst_underflow =
                            worse(&g.worst_underflow, metric(&r, "underflow_pct", "underflow_tensor"));
                        g.worst_mse = worse(&g.worst_mse, metric(&r, "mse", "mse_tensor"));
                    }
                    "high_precision" => g.high_precision_iterations += 1,
                    _ => {}
                }
            }
        }
        for path in stat_files {
            for r in lines::<StatLine>(&path)? {
                let v = r.value.unwrap_or(f64::NAN);
                let s = summary
                    .stats
                    .entry((r.layer, r.tensor, r.stat))
                    .or_insert(StatSummary {
                        records: 0,
                        max: (v, r.iteration),
                        last: (v, r.iteration),
                    });
                s.records += 1;
                if v > s.max.0 {
                    s.max = (v, r.iteration);
                }
                if r.iteration >= s.last.1 {
                    s.last = (v, r.iteration);
                }
            }
        }
        Ok(summary)
    }

    /// The summary as Markdown tables: the switch table, then the quantization statistics.
    pub fn to_markdown(&self) -> String {
        let mut out = self.switch_table();
        out.push_str(&self.quantized_table());
        if out.is_empty() {
            out.push_str("(no AutoswitchGemm samples or quantized statistics logged)\n");
        }
        out
    }

    /// Per (layer, GEMM): samples, switches, releases, high-precision iterations, worst metrics.
    pub fn switch_table(&self) -> String {
        let mut out = String::new();
        if !self.gemms.is_empty() {
            out.push_str(
                "| layer | gemm | samples | switches | releases | high-precision iterations | worst underflow % (tensor, iteration) | worst MSE (tensor, iteration) |\n\
                 |---|---|---|---|---|---|---|---|\n",
            );
            let show = |w: &Option<(f64, String, u64)>, precision: usize| match w {
                Some((v, t, it)) => format!("{v:.precision$} ({t}, {it})"),
                None => "-".into(),
            };
            for ((layer, gemm), g) in &self.gemms {
                out.push_str(&format!(
                    "| {layer} | {gemm} | {} | {} | {} | {} | {} | {} |\n",
                    g.samples,
                    g.switches,
                    g.releases,
                    g.high_precision_iterations,
                    show(&g.worst_underflow, 3),
                    show(&g.worst_mse, 9),
                ));
            }
        }
        out
    }

    /// Per (layer, tensor): the logged underflow and MSE statistics.
    pub fn quantized_table(&self) -> String {
        let mut out = String::new();
        let quantized: Vec<_> = self
            .stats
            .iter()
            .filter(|((_, _, stat), _)| stat.contains("underflows%") || stat.contains("mse"))
            .collect();
        if !quantized.is_empty() {
            out.push_str(
                "\n| layer | tensor | statistic | records | max (iteration) | last (iteration) |\n\
                 |---|---|---|---|---|---|\n",
            );
            for ((layer, tensor, stat), s) in quantized {
                out.push_str(&format!(
                    "| {layer} | {tensor} | {stat} | {} | {:.6e} ({}) | {:.6e} ({}) |\n",
                    s.records, s.max.0, s.max.1, s.last.0, s.last.1
                ));
            }
        }
        out
    }
}
