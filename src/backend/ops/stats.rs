//! `StatsOps`: the partial statistics of a tensor (and of what its quantization loses) that the
//! debug tools (`debug::stats`) reduce, as records of f32 fields (`STAT_FIELDS`) per 128x2048
//! block, from one read on device backends. The default computes them on the host
//! (`tensor_stats_on_host`) with the device kernel's reference (`tile_partials`, then
//! `record_partials`, below): step for step in the kernel's order, so that sums, counts, minima
//! and maxima agree (logarithms within the runtime's `ln`).

use burn::tensor::ops::{FloatTensor, IntTensor};

pub use burn_lowp_kernels::stats::{
    stats_records, ABS_SUM, AMAX, ELEMENTS, GROUP, LN_RANGE_2D, MAX, MAX_LN_RANGE_1D, MIN,
    MIN_NONZERO_ABS, NONZERO, OVERFLOWS, RECORD_TILE_COLS, RECORD_TILE_ROWS, SQUARED_ERROR,
    STATS_TILE, STAT_FIELDS, SUM, SUM_SQUARES, UNDERFLOWS,
};

use crate::backend::{matrix_dims, Groups, LowpBackend, QuantizedTensor};
use crate::error::{LowpError, Result};
use crate::format::Direction;

pub trait StatsOps<B: LowpBackend> {
    /// Partial statistics of `x` (viewed as `[rows, cols]`) for the debug tools: f32
    /// `[records, STAT_FIELDS]` bytes, one record per 128x2048 block (`debug::stats`). With
    /// `error = (dequantized, limit)` (an f32 copy of `x` after quantization, same shape, and the
    /// f32 overflow limit: one element, or one per group with `labels`) the quantization terms
    /// too. With `labels` (`row_group`: the Int group of each row, `count` or more for rows to
    /// leave out) the records name their group, so every group of a grouped tensor is measured
    /// by one launch. One read of `x` on device backends; this default computes the reference on
    /// the host (`tensor_stats_on_host`; a device backend falls back to it for odd `cols`).
    fn stats_tensor(
        x: FloatTensor<B>,
        error: Option<(FloatTensor<B>, FloatTensor<B>)>,
        labels: Option<(IntTensor<B>, usize)>,
    ) -> Result<B::Bytes> {
        tensor_stats_on_host::<B>(x, error, labels)
    }

    /// `stats_tensor` of `x` against `q`'s copies in `directions` (one or both) in one pass that
    /// decodes the copies itself, with no dequantized copy written: one set of records per
    /// direction, in the order asked, each equal bit for bit to
    /// `stats_tensor(x, Some((dequantized, limit)), labels)`, where the dequantized copy is
    /// `QuantizeOps::quantize_dequantize` (or `GroupedOps::grouped_dequantize` with `grouped`:
    /// the tensor's groups and the Int group of each row of `x`) and the limit is the debug
    /// tools' overflow limit: `fp8_max · scale_inv` for FP8 per-tensor copies (per group when
    /// grouped), none (+inf) for block scales. `x` is `[rows, q.cols]` with `rows <= q.rows` (a
    /// token tensor may leave out its padding rows). `None` where this backend or `q`'s format
    /// has no such pass (the caller dequantizes): CubeCL backends decode FP8 per-tensor and block
    /// copies.
    fn stats_quantization(
        x: FloatTensor<B>,
        q: &QuantizedTensor<B>,
        directions: &[Direction],
        grouped: Option<(&Groups<B>, IntTensor<B>)>,
    ) -> Result<Option<Vec<B::Bytes>>> {
        let _ = (x, q, directions, grouped);
        Ok(None)
    }
}

/// `StatsOps::stats_tensor` computed on the host (reads the tensors).
pub fn tensor_stats_on_host<B: LowpBackend>(
    x: FloatTensor<B>,
    error: Option<(FloatTensor<B>, FloatTensor<B>)>,
    labels: Option<(IntTensor<B>, usize)>,
) -> Result<B::Bytes> {
    use burn::tensor::{FloatDType, TensorMetadata};
    let device = B::float_device(&x);
    let (rows, cols) = matrix_dims(x.shape().as_slice());
    let read = |t: FloatTensor<B>| -> Result<Vec<f32>> {
        burn::tensor::read_sync(B::float_into_data(B::float_cast(t, FloatDType::F32)))
            .map_err(|e| LowpError::invalid("tensor read", "failed", format!("{e:?}")))?
            .to_vec::<f32>()
            .map_err(|e| LowpError::invalid("tensor read", "f32", format!("{e:?}")))
    };
    let values = read(x)?;
    let error = match error {
        Some((dq, limit)) => Some((read(dq)?, read(limit)?)),
        None => None,
    };
    let labels = match labels {
        Some((row_group, count)) => {
            let data = burn::tensor::read_sync(B::int_into_data(row_group))
                .map_err(|e| LowpError::invalid("row labels read", "failed", format!("{e:?}")))?;
            let row_group: Vec<u32> = data
                .convert::<i64>()
                .to_vec::<i64>()
                .map_err(|e| LowpError::invalid("row labels", "i64", format!("{e:?}")))?
                .into_iter()
                .map(|g| g.clamp(0, count as i64) as u32)
                .collect();
            Some((row_group, count))
        }
        None => None,
    };
    let tiles = tile_partials(
        &values,
        rows,
        cols,
        error.as_ref().map(|(dq, limit)| (dq.as_slice(), limit.as_slice())),
        labels.as_ref().map(|(row_group, count)| RowLabels {
            row_group,
            count: *count,
        }),
    );
    let partials = record_partials(&tiles, rows, cols);
    let bytes = partials.iter().flat_map(|v| v.to_le_bytes()).collect();
    Ok(B::bytes_from_host(bytes, &device))
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
