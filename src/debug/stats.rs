//! How much a quantization loses, measured as TE's debug tools measure it
//! (`debug/features/utils/stats_computation.py`, AutoswitchGemm), and the tensor statistics of
//! `LogTensorStats`.
//!
//! The device computes per-tile partials in one read (`burn_lowp_kernels::stats`, 32x32 tiles,
//! one 1x32 block per unit) and folds them into records of 128x2048 elements; `tile_partials` and
//! `record_partials` here are its reference, step for step in the same order (so sums, counts,
//! minima and maxima agree; logarithms within the runtime's `ln`). `TensorStats` reduces the
//! records in f64 and accumulates micro-batches by adding sums and counts (the same as TE's
//! Welford merge, up to rounding).

use crate::error::{LowpError, Result};
pub use burn_lowp_kernels::stats::{
    stats_records, ABS_SUM, AMAX, ELEMENTS, GROUP, LN_RANGE_2D, MAX, MAX_LN_RANGE_1D, MIN,
    MIN_NONZERO_ABS, NONZERO, OVERFLOWS, RECORD_TILE_COLS, RECORD_TILE_ROWS, SQUARED_ERROR,
    STATS_TILE, STAT_FIELDS, SUM, SUM_SQUARES, UNDERFLOWS,
};

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


fn ln_range(amax: f32, min_nonzero: f32) -> f32 {
    if amax > 0.0 {
        amax.ln() - min_nonzero.ln()
    } else {
        0.0
    }
}

fn tree_sum(values: &mut [f32; STATS_TILE]) -> f32 {
    let mut stride = STATS_TILE / 2;
    while stride > 0 {
        for u in 0..stride {
            values[u] += values[u + stride];
        }
        stride /= 2;
    }
    values[0]
}

fn tree_max(values: &[f32; STATS_TILE]) -> f32 {
    values.iter().fold(f32::NEG_INFINITY, |m, &v| if v > m { v } else { m })
}

/// Fields folded by sum, by min and by max (as the kernels' `cube_fold_fields`).
const SUM_FIELDS: [usize; 8] = [NONZERO, SUM, SUM_SQUARES, ABS_SUM, UNDERFLOWS, SQUARED_ERROR, OVERFLOWS, ELEMENTS];
const MIN_FIELDS: [usize; 3] = [MIN, MIN_NONZERO_ABS, GROUP];
const MAX_FIELDS: [usize; 4] = [MAX, AMAX, MAX_LN_RANGE_1D, LN_RANGE_2D];

/// A unit's empty accumulators (the kernels' `empty_fields`).
fn empty_unit() -> [f32; STAT_FIELDS] {
    let mut acc = [0.0f32; STAT_FIELDS];
    for f in MIN_FIELDS {
        acc[f] = f32::INFINITY;
    }
    acc[MAX] = f32::NEG_INFINITY;
    acc
}

/// The cube's fold of its units' accumulators (the kernels' `cube_fold_fields`).
fn fold_units(units: &[[f32; STAT_FIELDS]; STATS_TILE]) -> [f32; STAT_FIELDS] {
    let field = |f: usize| -> [f32; STATS_TILE] { std::array::from_fn(|u| units[u][f]) };
    let mut out = [0.0f32; STAT_FIELDS];
    for f in SUM_FIELDS {
        out[f] = tree_sum(&mut field(f));
    }
    for f in MIN_FIELDS {
        out[f] = -tree_max(&field(f).map(|v| -v));
    }
    for f in MAX_FIELDS {
        out[f] = tree_max(&field(f));
    }
    out
}

/// The groups of a grouped statistics input: the group of each row (`count` or more: a padding
/// row, left out).
#[derive(Debug, Clone, Copy)]
pub struct RowLabels<'a> {
    pub row_group: &'a [u32],
    pub count: usize,
}

/// The per-tile partials the device kernel writes (`[tiles, STAT_FIELDS]`, tiles row-major), for
/// `values [rows, cols]` and, with `error`, its dequantized copy and the overflow limits (one, or
/// one per group with `labels`); with `labels`, each tile folds its labelled rows and names their
/// group.
pub fn tile_partials(
    values: &[f32],
    rows: usize,
    cols: usize,
    error: Option<(&[f32], &[f32])>,
    labels: Option<RowLabels<'_>>,
) -> Vec<f32> {
    let groups = labels.map_or(1, |l| l.count);
    let tile_cols = cols.div_ceil(STATS_TILE);
    let tiles = rows.div_ceil(STATS_TILE) * tile_cols;
    let mut out = vec![0.0f32; tiles * STAT_FIELDS];
    for tile in 0..tiles {
        let first = (tile % tile_cols) * STATS_TILE;
        let end = (first + STATS_TILE).min(cols);
        let mut units = [empty_unit(); STATS_TILE];
        for (u, acc) in units.iter_mut().enumerate() {
            let row = (tile / tile_cols) * STATS_TILE + u;
            let group = match (row < rows, labels) {
                (false, _) => groups,
                (true, None) => 0,
                (true, Some(l)) => l.row_group[row] as usize,
            };
            acc[GROUP] = group as f32;
            if group < groups {
                acc[ELEMENTS] = (end - first) as f32;
                for c in first..end {
                    let v = values[row * cols + c];
                    if v != 0.0 {
                        acc[NONZERO] += 1.0;
                    }
                    acc[SUM] += v;
                    acc[SUM_SQUARES] += v * v;
                    let a = v.abs();
                    acc[ABS_SUM] += a;
                    if v < acc[MIN] {
                        acc[MIN] = v;
                    }
                    if v > acc[MAX] {
                        acc[MAX] = v;
                    }
                    if a > acc[AMAX] {
                        acc[AMAX] = a;
                    }
                    if a > 0.0 && a < acc[MIN_NONZERO_ABS] {
                        acc[MIN_NONZERO_ABS] = a;
                    }
                    if let Some((dq, limits)) = error {
                        let limit = limits[group];
                        let d = dq[row * cols + c];
                        if v != 0.0 && d == 0.0 {
                            acc[UNDERFLOWS] += 1.0;
                        }
                        let e2 = (v - d) * (v - d);
                        if e2 < f32::INFINITY {
                            acc[SQUARED_ERROR] += e2;
                        }
                        if a > limit {
                            acc[OVERFLOWS] += 1.0;
                        }
                    }
                }
            }
            acc[MAX_LN_RANGE_1D] = ln_range(acc[AMAX], acc[MIN_NONZERO_ABS]);
        }
        let mut t = fold_units(&units);
        t[LN_RANGE_2D] = ln_range(t[AMAX], t[MIN_NONZERO_ABS]);
        out[tile * STAT_FIELDS..(tile + 1) * STAT_FIELDS].copy_from_slice(&t);
    }
    out
}

/// The records the device folds `tiles` (`tile_partials` of a `[rows, cols]` tensor) into, in
/// the kernel's order: per record of up to `RECORD_TILE_ROWS x RECORD_TILE_COLS` tiles, unit u of
/// 32 folds the record's tiles u, u + 32, ... (row-major within the record), then the units'
/// sums meet in `cube_sum`'s tree.
pub fn record_partials(tiles: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    let (tile_rows, tile_cols) = (rows.div_ceil(STATS_TILE), cols.div_ceil(STATS_TILE));
    let record_cols = tile_cols.div_ceil(RECORD_TILE_COLS);
    let records = stats_records(rows, cols);
    let mut out = vec![0.0f32; records * STAT_FIELDS];
    for record in 0..records {
        let first_row = (record / record_cols) * RECORD_TILE_ROWS;
        let first_col = (record % record_cols) * RECORD_TILE_COLS;
        let span_rows = RECORD_TILE_ROWS.min(tile_rows - first_row);
        let span_cols = RECORD_TILE_COLS.min(tile_cols - first_col);
        let mut units = [empty_unit(); STATS_TILE];
        for (u, acc) in units.iter_mut().enumerate() {
            for i in (u..span_rows * span_cols).step_by(STATS_TILE) {
                let tile = (first_row + i / span_cols) * tile_cols + first_col + i % span_cols;
                let t = &tiles[tile * STAT_FIELDS..(tile + 1) * STAT_FIELDS];
                for f in SUM_FIELDS {
                    acc[f] += t[f];
                }
                for f in MIN_FIELDS {
                    if t[f] < acc[f] {
                        acc[f] = t[f];
                    }
                }
                for f in MAX_FIELDS {
                    if t[f] > acc[f] {
                        acc[f] = t[f];
                    }
                }
            }
        }
        out[record * STAT_FIELDS..(record + 1) * STAT_FIELDS].copy_from_slice(&fold_units(&units));
    }
    out
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
