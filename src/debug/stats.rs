//! How much a quantization loses, measured as TE's debug tools measure it
//! (`debug/features/utils/stats_computation.py`, AutoswitchGemm), and the tensor statistics of
//! `LogTensorStats`.
//!
//! The device computes per-tile partials in one read (`burn_lowp_kernels::stats`, 32x32 tiles, one
//! 1x32 block per unit) and folds them into records of 128x2048 elements; `tile_partials` and
//! `record_partials` (beside the backend's `StatsOps`, whose default they are) are its reference,
//! step for step in the same order (so sums, counts, minima and maxima agree; logarithms within the
//! runtime's `ln`). `TensorStats` reduces the records in f64 and accumulates micro-batches by
//! adding sums and counts (the same as TE's Welford merge, up to rounding).

use crate::error::{LowpError, Result};
pub use burn_lowp_kernels::stats::{
    stats_records, ABS_SUM, AMAX, ELEMENTS, GROUP, LN_RANGE_2D, MAX, MAX_LN_RANGE_1D, MIN,
    MIN_NONZERO_ABS, NONZERO, OVERFLOWS, RECORD_TILE_COLS, RECORD_TILE_ROWS, SQUARED_ERROR,
    STATS_TILE, STAT_FIELDS, SUM, SUM_SQUARES, UNDERFLOWS,
};

pub use crate::backend::ops::stats::{record_partials, tile_partials, RowLabels};

use super::config::{QuantizedStat, TensorStat};

/// Quality of one quantized tensor against its high-precision source.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct QuantizationError {
    /// `100 * count(x != 0 and dequantized == 0) / numel`: values flushed to zero.
    pub underflow_pct: f64,
    /// `mean((x - dequantized)^2)`.
    pub mse: f64,
}

impl QuantizationError {
    /// Compares a source with its dequantized copy (same layout, same length). Pairs whose
    /// difference is not finite (NaN or Inf inputs) are left out of the MSE.
    pub fn measure(source: &[f32], dequantized: &[f32]) -> Result<QuantizationError> {
        if source.len() != dequantized.len() {
            return Err(LowpError::shape(
                "dequantized",
                format!("{} values", dequantized.len()),
                format!("must match the source's {} values", source.len()),
            ));
        }
        let n = source.len().max(1) as f64;
        let mut underflows = 0usize;
        let mut squared = 0.0f64;
        for (&x, &q) in source.iter().zip(dequantized) {
            if x != 0.0 && q == 0.0 {
                underflows += 1;
            }
            let d = x as f64 - q as f64;
            if d.is_finite() {
                squared += d * d;
            }
        }
        Ok(QuantizationError {
            underflow_pct: 100.0 * underflows as f64 / n,
            mse: squared / n,
        })
    }
}

/// f32 partials from their little-endian bytes.
pub fn partials_from_bytes(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}

/// The little-endian bytes of a grouped tensor's partials (tiles or records) split per group
/// (`count` groups; those of padding rows only, whose group is `count`, belong to none), in one
/// pass.
pub fn split_partials_by_group(bytes: &[u8], count: usize) -> Vec<Vec<u8>> {
    let mut groups = vec![Vec::new(); count];
    for tile in bytes.chunks_exact(4 * STAT_FIELDS) {
        let at = 4 * GROUP;
        let g = f32::from_le_bytes([tile[at], tile[at + 1], tile[at + 2], tile[at + 3]]) as usize;
        if g < count {
            groups[g].extend_from_slice(tile);
        }
    }
    groups
}

/// Statistics of one tensor (accumulated over micro-batches), reduced from its partials.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TensorStats {
    pub numel: u64,
    pub nonzero: f64,
    pub sum: f64,
    pub sum_squares: f64,
    pub abs_sum: f64,
    pub min: f64,
    pub max: f64,
    pub amax: f64,
    pub min_nonzero_abs: f64,
    pub max_ln_range_1d: f64,
    pub max_ln_range_2d: f64,
    pub underflows: f64,
    pub squared_error: f64,
    pub overflows: f64,
}

impl TensorStats {
    /// Reduces f32 `[n, STAT_FIELDS]` partials (tiles or records); the element count is their
    /// `ELEMENTS`.
    pub fn from_partials(partials: &[f32]) -> TensorStats {
        let mut s = TensorStats {
            numel: 0,
            nonzero: 0.0,
            sum: 0.0,
            sum_squares: 0.0,
            abs_sum: 0.0,
            min: f64::INFINITY,
            max: f64::NEG_INFINITY,
            amax: 0.0,
            min_nonzero_abs: f64::INFINITY,
            max_ln_range_1d: 0.0,
            max_ln_range_2d: 0.0,
            underflows: 0.0,
            squared_error: 0.0,
            overflows: 0.0,
        };
        for t in partials.chunks_exact(STAT_FIELDS) {
            let f = |i: usize| t[i] as f64;
            s.numel += t[ELEMENTS] as u64;
            s.nonzero += f(NONZERO);
            s.sum += f(SUM);
            s.sum_squares += f(SUM_SQUARES);
            s.abs_sum += f(ABS_SUM);
            s.min = s.min.min(f(MIN));
            s.max = s.max.max(f(MAX));
            s.amax = s.amax.max(f(AMAX));
            s.min_nonzero_abs = s.min_nonzero_abs.min(f(MIN_NONZERO_ABS));
            s.max_ln_range_1d = s.max_ln_range_1d.max(f(MAX_LN_RANGE_1D));
            s.max_ln_range_2d = s.max_ln_range_2d.max(f(LN_RANGE_2D));
            s.underflows += f(UNDERFLOWS);
            s.squared_error += f(SQUARED_ERROR);
            s.overflows += f(OVERFLOWS);
        }
        s
    }

    pub fn from_partial_bytes(bytes: &[u8]) -> TensorStats {
        TensorStats::from_partials(&partials_from_bytes(bytes))
    }

    /// Accumulates another micro-batch of the same tensor.
    pub fn merge(&mut self, o: &TensorStats) {
        self.numel += o.numel;
        self.nonzero += o.nonzero;
        self.sum += o.sum;
        self.sum_squares += o.sum_squares;
        self.abs_sum += o.abs_sum;
        self.min = self.min.min(o.min);
        self.max = self.max.max(o.max);
        self.amax = self.amax.max(o.amax);
        self.min_nonzero_abs = self.min_nonzero_abs.min(o.min_nonzero_abs);
        self.max_ln_range_1d = self.max_ln_range_1d.max(o.max_ln_range_1d);
        self.max_ln_range_2d = self.max_ln_range_2d.max(o.max_ln_range_2d);
        self.underflows += o.underflows;
        self.squared_error += o.squared_error;
        self.overflows += o.overflows;
    }

    fn n(&self) -> f64 {
        self.numel.max(1) as f64
    }

    /// One `LogTensorStats` statistic.
    pub fn stat(&self, stat: TensorStat) -> f64 {
        let n = self.n();
        match stat {
            TensorStat::Min => self.min,
            TensorStat::Max => self.max,
            TensorStat::Mean => self.sum / n,
            // Bessel-corrected, as torch.std.
            TensorStat::Std => {
                let mean = self.sum / n;
                ((self.sum_squares - n * mean * mean).max(0.0) / (n - 1.0).max(1.0)).sqrt()
            }
            TensorStat::L1Norm => self.abs_sum,
            TensorStat::L2Norm => self.sum_squares.sqrt(),
            TensorStat::CurAmax => self.amax,
            TensorStat::DynamicRange => {
                if self.amax > 0.0 {
                    self.amax.log2() - self.min_nonzero_abs.log2()
                } else {
                    0.0
                }
            }
            TensorStat::MaxBlockwiseDynamicRange1d => self.max_ln_range_1d / std::f64::consts::LN_2,
            TensorStat::MaxBlockwiseDynamicRange2d => self.max_ln_range_2d / std::f64::consts::LN_2,
        }
    }

    /// The quantization error of these statistics (they must have been taken with the
    /// dequantized copy).
    pub fn quantization_error(&self) -> QuantizationError {
        QuantizationError {
            underflow_pct: 100.0 * self.underflows / self.n(),
            mse: self.squared_error / self.n(),
        }
    }

    /// `mse / mean(x²)`: the error relative to the tensor's power (scale-free).
    pub fn relative_mse(&self) -> f64 {
        let power = self.sum_squares / self.n();
        if power > 0.0 {
            self.squared_error / self.sum_squares
        } else {
            0.0
        }
    }

    /// One `LogQuantizedTensorStats` statistic computed from the partials (the scale statistics
    /// come from the scales, not from here: `None`).
    pub fn quantized_stat(&self, stat: QuantizedStat) -> Option<f64> {
        match stat {
            QuantizedStat::Underflows => Some(100.0 * self.underflows / self.n()),
            QuantizedStat::Overflows => Some(100.0 * self.overflows / self.n()),
            QuantizedStat::Mse => Some(self.squared_error / self.n()),
            QuantizedStat::ScaleInvMin | QuantizedStat::ScaleInvMax => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_flushed_values_and_squared_error() {
        let e = QuantizationError::measure(&[0.0, 1.0, 2.0, 0.001], &[0.0, 1.0, 1.5, 0.0]).unwrap();
        assert!(QuantizationError::measure(&[1.0], &[]).is_err());
        assert_eq!(e.underflow_pct, 25.0);
        assert!((e.mse - (0.25 + 1e-6) / 4.0).abs() < 1e-12);
    }
}
