//! AutoswitchGemm's decision for one (layer, GEMM), as TE's PR #2883 makes it: per sampling
//! iteration, the max over the monitored tensors of the underflow percentage and of the MSE; a
//! value above its threshold (strict `>`) switches the GEMM to high precision through the hold
//! window `[n, n + freq - 1]`; a sample without breach releases it. Pure host logic, so that the
//! schedule is tested without a GPU.

use serde::Serialize;

use super::config::{AutoswitchGemm, TensorKind};
use super::stats::QuantizationError;

/// The metrics of one GEMM at one sampling iteration: the worst of its monitored tensors.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct GemmMetrics {
    pub underflow_pct: f64,
    pub underflow_tensor: TensorKind,
    pub mse: f64,
    pub mse_tensor: TensorKind,
    pub relative_mse: f64,
    pub relative_mse_tensor: TensorKind,
}

impl GemmMetrics {
    /// The max of each metric over `(tensor, error, relative mse)`; `None` when empty.
    pub fn worst(tensors: &[(TensorKind, QuantizationError, f64)]) -> Option<GemmMetrics> {
        let (first, rest) = tensors.split_first()?;
        let mut m = GemmMetrics {
            underflow_pct: first.1.underflow_pct,
            underflow_tensor: first.0,
            mse: first.1.mse,
            mse_tensor: first.0,
            relative_mse: first.2,
            relative_mse_tensor: first.0,
        };
        for &(t, e, rel) in rest {
            if e.underflow_pct > m.underflow_pct {
                m.underflow_pct = e.underflow_pct;
                m.underflow_tensor = t;
            }
            if e.mse > m.mse {
                m.mse = e.mse;
                m.mse_tensor = t;
            }
            if rel > m.relative_mse {
                m.relative_mse = rel;
                m.relative_mse_tensor = t;
            }
        }
        Some(m)
    }

    /// Which threshold the metrics cross, if any (underflow first, then MSE, then relative MSE).
    pub fn breach(&self, config: &AutoswitchGemm) -> Option<Breach> {
        let over = |v: f64, t: Option<f64>| t.is_some_and(|t| v > t);
        if over(self.underflow_pct, config.underflow_threshold_pct) {
            Some(Breach {
                metric: "underflow_pct",
                tensor: self.underflow_tensor,
                value: self.underflow_pct,
                threshold: config.underflow_threshold_pct.unwrap_or_default(),
            })
        } else if over(self.mse, config.mse_threshold) {
            Some(Breach {
                metric: "mse",
                tensor: self.mse_tensor,
                value: self.mse,
                threshold: config.mse_threshold.unwrap_or_default(),
            })
        } else if over(self.relative_mse, config.relative_mse_threshold) {
            Some(Breach {
                metric: "relative_mse",
                tensor: self.relative_mse_tensor,
                value: self.relative_mse,
                threshold: config.relative_mse_threshold.unwrap_or_default(),
            })
        } else {
            None
        }
    }
}

/// The threshold a sample crossed.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Breach {
    pub metric: &'static str,
    pub tensor: TensorKind,
    pub value: f64,
    pub threshold: f64,
}

/// What a sample did to the switch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SwitchEvent {
    /// The previous sample was clean (or there was none): high precision from this iteration.
    Switch,
    /// The previous sample breached, and this one does again: the window moves on.
    Hold,
    /// The previous sample breached, this one is clean: quantized again.
    Release,
    /// Quantized, and stays so.
    Clean,
}

/// The switch of one (layer, GEMM).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SwitchState {
    /// The GEMM runs in high precision through this iteration.
    pub disable_until: Option<u64>,
}

impl SwitchState {
    /// Whether the GEMM runs in high precision at iteration `it` (before any sample at `it`).
    pub fn high_precision_at(&self, it: u64) -> bool {
        self.disable_until.is_some_and(|until| it <= until)
    }

    /// Applies a sample taken for iteration `it` (its metrics), the hold window lasting `freq`
    /// iterations.
    pub fn apply_sample(
        &mut self,
        it: u64,
        freq: u64,
        metrics: &GemmMetrics,
        config: &AutoswitchGemm,
    ) -> (SwitchEvent, Option<Breach>) {
        // Whether the previous sample breached (its window may have ended already).
        let was = self.disable_until.is_some();
        let breach = metrics.breach(config);
        let event = match (was, breach.is_some()) {
            (false, true) => SwitchEvent::Switch,
            (true, true) => SwitchEvent::Hold,
            (true, false) => SwitchEvent::Release,
            (false, false) => SwitchEvent::Clean,
        };
        self.disable_until = breach.map(|_| it + freq.max(1) - 1);
        (event, breach)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> AutoswitchGemm {
        serde_json::from_str(r#"{"freq": 10}"#).unwrap()
    }

    fn metrics(underflow_pct: f64, mse: f64) -> GemmMetrics {
        GemmMetrics::worst(&[(
            TensorKind::Gradient,
            QuantizationError { underflow_pct, mse },
            0.0,
        )])
        .unwrap()
    }

    #[test]
    fn breach_switches_through_the_window_and_a_clean_sample_releases() {
        let c = config();
        let mut s = SwitchState::default();
        assert_eq!(s.apply_sample(0, 10, &metrics(1.0, 0.0), &c).0, SwitchEvent::Clean);
        assert!(!s.high_precision_at(0));
        let (event, breach) = s.apply_sample(10, 10, &metrics(6.0, 0.0), &c);
        assert_eq!(event, SwitchEvent::Switch);
        assert_eq!(breach.unwrap().metric, "underflow_pct");
        assert!(s.high_precision_at(10) && s.high_precision_at(19) && !s.high_precision_at(20));
        // Breaching again (here on the MSE) holds the switch: the window moves on.
        assert_eq!(s.apply_sample(20, 10, &metrics(0.0, 2e-4), &c).0, SwitchEvent::Hold);
        assert!(s.high_precision_at(29) && !s.high_precision_at(30));
        // At the thresholds is not above them: released.
        assert_eq!(s.apply_sample(30, 10, &metrics(5.0, 1e-4), &c).0, SwitchEvent::Release);
        assert!(!s.high_precision_at(30));
        assert_eq!(s.apply_sample(40, 10, &metrics(6.0, 0.0), &c).0, SwitchEvent::Switch);
    }

    #[test]
    fn worst_takes_each_metric_from_its_own_tensor() {
        let e = |u, m| QuantizationError { underflow_pct: u, mse: m };
        let w = GemmMetrics::worst(&[
            (TensorKind::Activation, e(1.0, 3.0), 0.1),
            (TensorKind::Weight, e(2.0, 1.0), 0.3),
        ])
        .unwrap();
        assert_eq!((w.underflow_tensor, w.mse_tensor), (TensorKind::Weight, TensorKind::Activation));
        assert_eq!((w.underflow_pct, w.mse, w.relative_mse), (2.0, 3.0, 0.3));
        assert!(GemmMetrics::worst(&[]).is_none());
    }
}
