//! Tensor statistics for the precision debug tools, in one read of the tensor: each cube takes a
//! 32x32 tile, each of its 32 units one row of the tile (one 1D block of 32 elements along the
//! last dimension), and the cube writes the tile's partial statistics (`STAT_FIELDS` f32). A
//! second launch folds the tiles into records of 128 rows x 2048 columns (`stats_records_kernel`),
//! so that what the host reads and reduces is 256 times smaller than the tiles: a sampling step of
//! the MoE example produced about 217 MB of tiles. The host reduces the records
//! (`burn_lowp::debug::stats`, which also holds the reference these kernels are tested against).
//!
//! With the dequantized copy of the tensor (f32, same layout) it also counts underflows (non-zero
//! inputs that quantize to zero) and sums the squared quantization error; with an overflow limit
//! (delayed scaling's `fp8_max · scale_inv`, one f32 per group on the device) it counts
//! `|x| > limit`.
//!
//! The quantized copy can also come as FP8 codes (per-tensor or block scales, one group or the
//! groups of a grouped tensor), decoded in the pass exactly as `dequantize_fp8_kernel` and
//! `dequantize_fp8_grouped_kernel` decode them, with the per-tensor overflow limit
//! `fp8_max · scale_inv` formed in the pass as the debug layer forms it on the host side
//! (`StatsError::Fp8Codes`). The records are then bit-equal to those of the dequantized copy, and
//! a debug observation saves the dequantize launch, its f32 copy and the limit's launches: a
//! sampling step of the MoE example is bound by how many launches it hands CubeCL's device thread.
//!
//! Grouped tensors (an MoE layer's experts, one launch for all of them): with row labels (the
//! group of each row, `groups` or more for padding rows, which fold nothing) every tile writes the
//! group it belongs to (`GROUP`) and how many elements it folded (`ELEMENTS`), so the host splits
//! the partials per group after the read without knowing the split sizes when it launches. Tiles
//! never straddle two groups: groups start at multiples of 128 rows (`format::grouped`).

use crate::cast::codec::Fp8Kind;
use crate::cast::dequantize::{fp8_grouped_element, Fp8Scales};
use crate::grouped::group_layout::RowGroups;
use crate::util::buffers::arg;
use crate::util::elements::ElemKind;
use crate::util::error::KernelError;
use crate::util::matrix::InputMatrix;
use crate::util::pairs::load_pair;
use crate::util::reduce::{cube_max_f32, cube_sum, plane_tree_max, plane_tree_sum, planes_of_32};
use cubecl::prelude::*;

/// Rows and columns of a tile; units per cube.
pub const STATS_TILE: usize = 32;
/// f32 fields per tile in the output.
pub const STAT_FIELDS: usize = 16;
/// Field indices. Counts are exact (at most 1024 per tile).
pub const NONZERO: usize = 0;
pub const SUM: usize = 1;
pub const SUM_SQUARES: usize = 2;
pub const ABS_SUM: usize = 3;
pub const MIN: usize = 4;
pub const MAX: usize = 5;
pub const AMAX: usize = 6;
/// Smallest non-zero `|x|` (+inf when the tile has none).
pub const MIN_NONZERO_ABS: usize = 7;
/// Max over the tile's 1D blocks of `ln(block amax) - ln(block min non-zero |x|)` (0 for a block
/// of zeros); the tile's own (2D, 32x32) range.
pub const MAX_LN_RANGE_1D: usize = 8;
pub const LN_RANGE_2D: usize = 9;
pub const UNDERFLOWS: usize = 10;
/// `Σ (x - dq)²` over the pairs whose difference is finite.
pub const SQUARED_ERROR: usize = 11;
pub const OVERFLOWS: usize = 12;
/// The tile's group (0 without labels; `groups` for a tile of padding rows only).
pub const GROUP: usize = 13;
/// Elements the tile folded (padding rows left out).
pub const ELEMENTS: usize = 14;

/// `ln(amax) - ln(min non-zero)` of a block, 0 for a block of zeros.
#[cube]
fn ln_range(amax: f32, min_nonzero: f32) -> f32 {
    let mut r = 0.0f32;
    if amax > 0.0f32 {
        r = f32::ln(amax) - f32::ln(min_nonzero);
    }
    r
}

/// One element's contribution to a unit's accumulators (see the field docs).
#[cube]
fn fold_value(v: f32, acc: &mut Array<f32>) {
    if v != 0.0f32 {
        acc[NONZERO] += 1.0f32;
    }
    acc[SUM] += v;
    acc[SUM_SQUARES] += v * v;
    let a = f32::abs(v);
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
    if a > 0.0f32 && a < acc[MIN_NONZERO_ABS] {
        acc[MIN_NONZERO_ABS] = a;
    }
}

/// The quantization terms of one element against its dequantized value `d`.
#[cube]
fn fold_error(v: f32, d: f32, limit: f32, infinity: f32, acc: &mut Array<f32>) {
    if v != 0.0f32 && d == 0.0f32 {
        acc[UNDERFLOWS] += 1.0f32;
    }
    let e = v - d;
    let e2 = e * e;
    // NaN or infinite differences stay out of the sum (NaN < inf is false).
    if e2 < infinity {
        acc[SQUARED_ERROR] += e2;
    }
    if f32::abs(v) > limit {
        acc[OVERFLOWS] += 1.0f32;
    }
}

/// A unit's empty accumulators: every field at the identity of its fold (0 for sums and for the
/// maxima of non-negative values, +inf for minima, -inf for `MAX`).
#[cube]
fn empty_fields(acc: &mut Array<f32>, infinity: f32) {
    #[unroll]
    for i in 0..STAT_FIELDS {
        acc[i] = 0.0f32;
    }
    acc[MIN] = infinity;
    acc[MAX] = -infinity;
    acc[MIN_NONZERO_ABS] = infinity;
    acc[GROUP] = infinity;
}

/// Sum over the cube of 32 units (`cube_sum`'s tree; by plane shuffles with `planes`).
#[cube]
fn tile_sum(value: f32, scratch: &mut SharedMemory<f32>, #[comptime] planes: bool) -> f32 {
    if comptime![planes] {
        plane_tree_sum(value)
    } else {
        cube_sum(value, scratch, STATS_TILE)
    }
}

/// Max over the cube of 32 units (`cube_max_f32`'s tree; by plane shuffles with `planes`).
#[cube]
fn tile_max(value: f32, scratch: &mut SharedMemory<f32>, #[comptime] planes: bool) -> f32 {
    if comptime![planes] {
        plane_tree_max(value)
    } else {
        cube_max_f32(value, scratch, STATS_TILE)
    }
}

/// Every unit's accumulators folded over the cube into `fields` (for every unit): sums and counts
/// by `cube_sum`'s fixed tree, extremes, ranges and the group by max or min. The error terms only
/// `with_error` (else they are zero). With `planes` (a cube is one 32-lane plane) the trees run
/// as warp shuffles: the same order, the same bits, no barriers.
#[cube]
fn cube_fold_fields(
    acc: &Array<f32>,
    fields: &mut Array<f32>,
    scratch: &mut SharedMemory<f32>,
    #[comptime] with_error: bool,
    #[comptime] planes: bool,
) {
    #[unroll]
    for i in 0..STAT_FIELDS {
        fields[i] = 0.0f32;
    }
    fields[NONZERO] = tile_sum(acc[NONZERO], scratch, planes);
    fields[SUM] = tile_sum(acc[SUM], scratch, planes);
    fields[SUM_SQUARES] = tile_sum(acc[SUM_SQUARES], scratch, planes);
    fields[ABS_SUM] = tile_sum(acc[ABS_SUM], scratch, planes);
    fields[ELEMENTS] = tile_sum(acc[ELEMENTS], scratch, planes);
    if comptime![with_error] {
        fields[UNDERFLOWS] = tile_sum(acc[UNDERFLOWS], scratch, planes);
        fields[SQUARED_ERROR] = tile_sum(acc[SQUARED_ERROR], scratch, planes);
        fields[OVERFLOWS] = tile_sum(acc[OVERFLOWS], scratch, planes);
    }
    fields[MIN] = -tile_max(-acc[MIN], scratch, planes);
    fields[MIN_NONZERO_ABS] = -tile_max(-acc[MIN_NONZERO_ABS], scratch, planes);
    fields[GROUP] = -tile_max(-acc[GROUP], scratch, planes);
    fields[MAX] = tile_max(acc[MAX], scratch, planes);
    fields[AMAX] = tile_max(acc[AMAX], scratch, planes);
    fields[MAX_LN_RANGE_1D] = tile_max(acc[MAX_LN_RANGE_1D], scratch, planes);
    fields[LN_RANGE_2D] = tile_max(acc[LN_RANGE_2D], scratch, planes);
}

/// Element `(r, c)` of the quantized copy as FP8 codes decode it (`fp8_grouped_element`, the
/// grouped dequantize kernel's own decode; one group of `code_rows` rows when ungrouped).
/// `opaque` is 0 at run time: OR-ing it into the product's bits hides the product from the
/// compiler, which would otherwise contract it with the subtraction in `fold_error` into one FMA
/// (one rounding where the dequantized copy rounds twice).
#[cube]
#[allow(clippy::too_many_arguments)]
fn decoded_fp8(
    codes: &Array<u32>,
    scales: &Array<u32>,
    r: usize,
    c: usize,
    cols: usize,
    g: usize,
    start: usize,
    len: usize,
    opaque: u32,
    #[comptime] fp8: Fp8Kind,
    #[comptime] scale_rows_per_block: usize,
    #[comptime] transposed: bool,
) -> f32 {
    let value = fp8_grouped_element(
        codes, scales, r, c, cols, g, start, len, fp8, scale_rows_per_block, transposed,
    );
    f32::reinterpret(u32::reinterpret(value) | opaque)
}

/// Partial statistics of the tiles of `input [rows, cols]` (raw words of `kind`, `cols` even),
/// `out [copies.max(1)][tiles][STAT_FIELDS]`.
/// With `labelled`, `row_group[r]` is row r's group (i32 bits; `groups` or more: left out);
/// without, every row is group 0. With `copies` 1, the quantized copy: when not `decoded`,
/// `error_values` holds its f32 bits in x's layout and `error_scales` one overflow limit per
/// group (f32 bits); when `decoded`, `error_values` holds FP8 codes and `error_scales` their f32 scales
/// (`decoded_fp8`; groups from `group_start` / `group_len` when `labelled`, else one group of
/// `code_rows` rows), and the limit of a per-tensor scale is `fp8_max · scale_inv` (none for
/// block scales). With `copies` 2 (decoded only), `second_values` / `second_scales` hold a second
/// copy, transposed where the first is not (a tensor's rowwise and columnwise copies, both
/// measured in the one read of x): its tiles repeat the first's value fields with its own error
/// terms, each folded exactly as a pass of its own would fold it.
/// `infinity` is +inf, passed in: CubeCL 0.10's CUDA backend prints an infinite f32 constant as
/// `float(inf)` and a reinterpreted constant as a cast of an rvalue, both of which NVRTC rejects.
#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
pub fn tensor_stats_kernel(
    input: &Array<u32>,
    error_values: &Array<u32>,
    error_scales: &Array<u32>,
    second_values: &Array<u32>,
    second_scales: &Array<u32>,
    row_group: &Array<u32>,
    group_start: &Array<u32>,
    group_len: &Array<u32>,
    out: &mut Array<f32>,
    rows: usize,
    cols: usize,
    tiles: usize,
    groups: usize,
    code_rows: usize,
    fp8_max: f32,
    opaque: u32,
    infinity: f32,
    #[comptime] kind: ElemKind,
    #[comptime] copies: usize,
    #[comptime] labelled: bool,
    #[comptime] decoded: bool,
    #[comptime] fp8: Fp8Kind,
    #[comptime] scale_rows_per_block: usize,
    #[comptime] transposed: bool,
    #[comptime] planes: bool,
) {
    let mut scratch = SharedMemory::<f32>::new(STATS_TILE);
    let mut acc = Array::<f32>::new(STAT_FIELDS);
    empty_fields(&mut acc, infinity);
    // The second copy's error terms (in the same field slots).
    let mut second = Array::<f32>::new(STAT_FIELDS);
    empty_fields(&mut second, infinity);
    let tile = CUBE_POS as usize;
    let tile_cols = cols.div_ceil(STATS_TILE);
    let row = (tile / tile_cols) * STATS_TILE + UNIT_POS as usize;
    let first = (tile % tile_cols) * STATS_TILE;
    let mut end = first + STATS_TILE;
    if end > cols {
        end = cols;
    }
    // The row's group; rows past the end and padding rows get `groups` and fold nothing, but
    // still take part in the synchronizing reductions below (as do extra cubes).
    let mut group = groups;
    if row < rows {
        group = 0usize;
        if comptime![labelled] {
            group = usize::cast_from(row_group[row]);
        }
    }
    if tile < tiles && group < groups {
        let base = row * cols;
        acc[ELEMENTS] = f32::cast_from(end - first);
        // The decoded copies' group rows and overflow limits.
        let mut start = 0usize;
        let mut len = code_rows;
        let mut limit = infinity;
        let mut second_limit = infinity;
        if comptime![copies > 0] {
            if comptime![decoded] {
                if comptime![labelled] {
                    start = usize::cast_from(group_start[group]);
                    len = usize::cast_from(group_len[group]);
                }
                if comptime![scale_rows_per_block == 0] {
                    limit = f32::reinterpret(error_scales[group]) * fp8_max;
                    if comptime![copies > 1] {
                        second_limit = f32::reinterpret(second_scales[group]) * fp8_max;
                    }
                }
            } else {
                limit = f32::reinterpret(error_scales[group]);
            }
        }
        for c in range_stepped(first, end, 2usize) {
            let (a, b) = load_pair(input, base + c, kind);
            fold_value(a, &mut acc);
            fold_value(b, &mut acc);
            if comptime![copies > 0] {
                let (da, db) = if comptime![decoded] {
                    (
                        decoded_fp8(
                            error_values, error_scales, row, c, cols, group, start, len, opaque,
                            fp8, scale_rows_per_block, transposed,
                        ),
                        decoded_fp8(
                            error_values, error_scales, row, c + 1, cols, group, start, len, opaque,
                            fp8, scale_rows_per_block, transposed,
                        ),
                    )
                } else {
                    (
                        f32::reinterpret(error_values[base + c]),
                        f32::reinterpret(error_values[base + c + 1]),
                    )
                };
                fold_error(a, da, limit, infinity, &mut acc);
                fold_error(b, db, limit, infinity, &mut acc);
            }
            if comptime![copies > 1] {
                let sa = decoded_fp8(
                    second_values, second_scales, row, c, cols, group, start, len, opaque,
                    fp8, scale_rows_per_block, !transposed,
                );
                let sb = decoded_fp8(
                    second_values, second_scales, row, c + 1, cols, group, start, len, opaque,
                    fp8, scale_rows_per_block, !transposed,
                );
                fold_error(a, sa, second_limit, infinity, &mut second);
                fold_error(b, sb, second_limit, infinity, &mut second);
            }
        }
    }
    // The row's 1D block range; the tile's 2D range from the folded extremes below. Every
    // folding row of a tile has the same group (groups are 128-row aligned): the minimum.
    acc[MAX_LN_RANGE_1D] = ln_range(acc[AMAX], acc[MIN_NONZERO_ABS]);
    acc[GROUP] = f32::cast_from(group);
    let mut tile_fields = Array::<f32>::new(STAT_FIELDS);
    cube_fold_fields(&acc, &mut tile_fields, &mut scratch, copies > 0, planes);
    tile_fields[LN_RANGE_2D] = ln_range(tile_fields[AMAX], tile_fields[MIN_NONZERO_ABS]);
    if tile < tiles && UNIT_POS == 0 {
        #[unroll]
        for i in 0..STAT_FIELDS {
            out[tile * STAT_FIELDS + i] = tile_fields[i];
        }
    }
    if comptime![copies > 1] {
        // The second copy's terms by the same fixed tree as the first's.
        tile_fields[UNDERFLOWS] = tile_sum(second[UNDERFLOWS], &mut scratch, planes);
        tile_fields[SQUARED_ERROR] = tile_sum(second[SQUARED_ERROR], &mut scratch, planes);
        tile_fields[OVERFLOWS] = tile_sum(second[OVERFLOWS], &mut scratch, planes);
        if tile < tiles && UNIT_POS == 0 {
            #[unroll]
            for i in 0..STAT_FIELDS {
                out[(tiles + tile) * STAT_FIELDS + i] = tile_fields[i];
            }
        }
    }
}

/// Tiles of a `[rows, cols]` tensor.
pub fn stats_tiles(rows: usize, cols: usize) -> usize {
    rows.div_ceil(STATS_TILE) * cols.div_ceil(STATS_TILE)
}

/// Tile rows of a record: 128 rows, the grouped layouts' alignment, so that a record never holds
/// two groups' rows (only a group's rows and padding rows, whose tiles fold nothing).
pub const RECORD_TILE_ROWS: usize = 4;
/// Tile columns of a record: 2048 columns, so that a record folds at most 2^18 elements and its
/// counts stay exact in f32.
pub const RECORD_TILE_COLS: usize = 64;

/// Records of a `[rows, cols]` tensor's statistics (row-major over 128x2048 blocks).
pub fn stats_records(rows: usize, cols: usize) -> usize {
    rows.div_ceil(STATS_TILE).div_ceil(RECORD_TILE_ROWS) * cols.div_ceil(STATS_TILE).div_ceil(RECORD_TILE_COLS)
}

/// Folds one tile's partials (at `t` in `tiles`) into a unit's record accumulators: sums and
/// counts add, extremes and ranges take their max or min, the group its min (a tile of padding
/// rows only names `groups`, past every real group).
#[cube]
fn fold_tile(tiles: &Array<f32>, t: usize, acc: &mut Array<f32>) {
    acc[NONZERO] += tiles[t + NONZERO];
    acc[SUM] += tiles[t + SUM];
    acc[SUM_SQUARES] += tiles[t + SUM_SQUARES];
    acc[ABS_SUM] += tiles[t + ABS_SUM];
    acc[UNDERFLOWS] += tiles[t + UNDERFLOWS];
    acc[SQUARED_ERROR] += tiles[t + SQUARED_ERROR];
    acc[OVERFLOWS] += tiles[t + OVERFLOWS];
    acc[ELEMENTS] += tiles[t + ELEMENTS];
    // Comparisons, not fmin/fmax, so that the host's reference picks the same value.
    if tiles[t + MIN] < acc[MIN] {
        acc[MIN] = tiles[t + MIN];
    }
    if tiles[t + MIN_NONZERO_ABS] < acc[MIN_NONZERO_ABS] {
        acc[MIN_NONZERO_ABS] = tiles[t + MIN_NONZERO_ABS];
    }
    if tiles[t + GROUP] < acc[GROUP] {
        acc[GROUP] = tiles[t + GROUP];
    }
    if tiles[t + MAX] > acc[MAX] {
        acc[MAX] = tiles[t + MAX];
    }
    if tiles[t + AMAX] > acc[AMAX] {
        acc[AMAX] = tiles[t + AMAX];
    }
    if tiles[t + MAX_LN_RANGE_1D] > acc[MAX_LN_RANGE_1D] {
        acc[MAX_LN_RANGE_1D] = tiles[t + MAX_LN_RANGE_1D];
    }
    if tiles[t + LN_RANGE_2D] > acc[LN_RANGE_2D] {
        acc[LN_RANGE_2D] = tiles[t + LN_RANGE_2D];
    }
}

/// Records (same fields as the tiles) of the `[tile_rows, tile_cols]` tiles of a statistics
/// launch: one cube per record of up to `RECORD_TILE_ROWS x RECORD_TILE_COLS` tiles; unit u folds
/// the record's tiles u, u + 32, ... (row-major within the record) in that order, then the cube
/// sums the units' accumulators by the fixed tree of `cube_sum`. The host's reference
/// (`burn_lowp::debug::stats::record_partials`) folds in the same order. `copies` sets of tiles
/// (one per measured copy, `tile_rows * tile_cols` each) give as many sets of records.
#[cube(launch_unchecked)]
pub fn stats_records_kernel(
    tiles: &Array<f32>,
    out: &mut Array<f32>,
    tile_rows: usize,
    tile_cols: usize,
    records: usize,
    copies: usize,
    infinity: f32,
    #[comptime] planes: bool,
) {
    let mut scratch = SharedMemory::<f32>::new(STATS_TILE);
    let mut acc = Array::<f32>::new(STAT_FIELDS);
    empty_fields(&mut acc, infinity);
    let copy = CUBE_POS as usize / records;
    let copy_tiles = copy * tile_rows * tile_cols;
    let mut record = CUBE_POS as usize % records;
    if copy >= copies {
        record = records;
    }
    // The record's tiles: rows [first_row, first_row + span_rows) x columns [first_col, + span_cols).
    let mut span_rows = 0usize;
    let mut span_cols = 1usize;
    let mut first_row = 0usize;
    let mut first_col = 0usize;
    if record < records {
        let record_cols = tile_cols.div_ceil(RECORD_TILE_COLS);
        first_row = (record / record_cols) * RECORD_TILE_ROWS;
        first_col = (record % record_cols) * RECORD_TILE_COLS;
        span_rows = RECORD_TILE_ROWS;
        if first_row + span_rows > tile_rows {
            span_rows = tile_rows - first_row;
        }
        span_cols = RECORD_TILE_COLS;
        if first_col + span_cols > tile_cols {
            span_cols = tile_cols - first_col;
        }
    }
    for i in range_stepped(UNIT_POS as usize, span_rows * span_cols, STATS_TILE) {
        let tile = copy_tiles + (first_row + i / span_cols) * tile_cols + first_col + i % span_cols;
        fold_tile(tiles, tile * STAT_FIELDS, &mut acc);
    }
    let mut fields = Array::<f32>::new(STAT_FIELDS);
    cube_fold_fields(&acc, &mut fields, &mut scratch, true, planes);
    if record < records && UNIT_POS == 0 {
        #[unroll]
        for i in 0..STAT_FIELDS {
            out[(copy * records + record) * STAT_FIELDS + i] = fields[i];
        }
    }
}

/// Row labels of a grouped statistics input: the i32 group of each row (`count` or more: left
/// out).
#[derive(Clone, Copy)]
pub struct RowLabels<'a> {
    pub row_group: &'a cubecl::server::Handle,
    pub count: usize,
}

/// The quantized copy a statistics pass measures `x` against.
#[derive(Clone, Copy)]
pub enum StatsError<'a> {
    /// The f32 dequantized copy (x's layout) and the f32 overflow limits (one, or one per group
    /// with labels).
    Dequantized {
        values: &'a cubecl::server::Handle,
        limits: &'a cubecl::server::Handle,
    },
    /// FP8 codes and their f32 scales, laid out as `dequantize_fp8_grouped` reads them (its
    /// groups with labels; else one group of `code_rows` storage rows), decoded in the pass; the
    /// overflow limit of a per-tensor scale is `fp8_max · scale_inv`, block scales have none.
    /// `copy` is the rowwise or the columnwise copy, or both (measured in the one read of x:
    /// `tensor_stats` then returns the rowwise records, then the columnwise).
    Fp8Codes {
        copy: Fp8Copy<'a>,
        groups: Option<RowGroups<'a>>,
        code_rows: usize,
        fp8: Fp8Kind,
        fp8_max: f32,
        scales_kind: Fp8Scales,
    },
}

/// The FP8 codes and f32 scales of one copy.
#[derive(Clone, Copy)]
pub struct Fp8Codes<'a> {
    pub codes: &'a cubecl::server::Handle,
    pub scales: &'a cubecl::server::Handle,
}

/// Which copies of a tensor a decoding statistics pass measures.
#[derive(Clone, Copy)]
pub enum Fp8Copy<'a> {
    Rowwise(Fp8Codes<'a>),
    Columnwise(Fp8Codes<'a>),
    Both { rowwise: Fp8Codes<'a>, columnwise: Fp8Codes<'a> },
}

/// The f32 `[records, STAT_FIELDS]` partial statistics of `x` (`cols` even; `stats_records`):
/// the tiles of one launch folded into records by a second; with `error`, the quantization terms
/// against that copy: one set of records per copy measured, one after the other in the buffer
/// returned (rowwise first when both). The cube reductions run as warp shuffles where planes are
/// 32 lanes wide (`planes_of_32`), else through shared memory: the same trees either way.
pub fn tensor_stats<R: Runtime>(
    client: &ComputeClient<R>,
    x: InputMatrix,
    error: Option<StatsError<'_>>,
    labels: Option<RowLabels<'_>>,
) -> Result<cubecl::server::Handle, KernelError> {
    tensor_stats_with_trees(client, x, error, labels, planes_of_32(client))
}

/// `tensor_stats` with its reductions as plane shuffles (`planes`; only where `planes_of_32`) or
/// through shared memory (anywhere), so a test can hold one against the other.
pub fn tensor_stats_with_trees<R: Runtime>(
    client: &ComputeClient<R>,
    x: InputMatrix,
    error: Option<StatsError<'_>>,
    labels: Option<RowLabels<'_>>,
    planes: bool,
) -> Result<cubecl::server::Handle, KernelError> {
    if planes && !planes_of_32(client) {
        return Err(KernelError {
            value: "plane reductions".into(),
            rule: "need planes of exactly 32 lanes with plane operations".into(),
        });
    }
    if x.rows == 0 || x.cols == 0 || x.cols % 2 != 0 || x.rows * x.cols >= u32::MAX as usize {
        return Err(KernelError {
            value: format!("shape [{}, {}]", x.rows, x.cols),
            rule: "tensor statistics need a non-empty matrix with an even last dimension".into(),
        });
    }
    let tiles = stats_tiles(x.rows, x.cols);
    let elements = x.rows * x.cols;
    let words = elements * x.kind.bytes() / 4;
    // Arrays a launch does not read: any buffer will do (one element of x's).
    let unread = || arg(x.handle, 1);
    let groups = labels.map_or(1, |l| l.count);
    let row_group = match labels {
        Some(l) => arg(l.row_group, x.rows),
        None => unread(),
    };
    // The comptime decode (decoded, fp8, rows per scale block, transposed), the arrays of the
    // copies (values and scales of the first, then of the second), the groups' starts and
    // lengths, and the codes' rows and FP8 maximum.
    let mut decode = (false, Fp8Kind::E4M3, 0usize, false);
    let (mut start, mut len) = (unread(), unread());
    let (mut code_rows, mut fp8_max) = (x.rows, 0.0f32);
    let (copies, first, second) = match error {
        None => (0usize, (unread(), unread()), (unread(), unread())),
        Some(StatsError::Dequantized { values, limits }) => (
            1,
            (arg(values, elements), arg(limits, groups)),
            (unread(), unread()),
        ),
        Some(StatsError::Fp8Codes {
            copy,
            groups: code_groups,
            code_rows: rows_of_codes,
            fp8,
            fp8_max: max,
            scales_kind,
        }) => {
            if code_groups.is_some() != labels.is_some() || rows_of_codes < x.rows {
                return Err(KernelError {
                    value: format!("{} code rows, grouped codes {}, labels {}", rows_of_codes, code_groups.is_some(), labels.is_some()),
                    rule: "decoded statistics need codes for every row of x, grouped exactly when the rows are labelled".into(),
                });
            }
            let spb = scales_kind.rows_per_block();
            if let Some(g) = code_groups {
                (start, len) = g.args();
            }
            code_rows = rows_of_codes;
            fp8_max = max;
            let scale_words = if spb == 0 { groups } else { rows_of_codes * x.cols / (128 * spb) }.max(1);
            let arrays = |c: Fp8Codes<'_>| {
                (
                    arg(c.codes, (rows_of_codes * x.cols).div_ceil(4)),
                    arg(c.scales, scale_words),
                )
            };
            let (copies, transposed, first, second) = match copy {
                Fp8Copy::Rowwise(c) => (1, false, arrays(c), (unread(), unread())),
                Fp8Copy::Columnwise(c) => (1, true, arrays(c), (unread(), unread())),
                Fp8Copy::Both { rowwise, columnwise } => (2, false, arrays(rowwise), arrays(columnwise)),
            };
            decode = (true, fp8, spb, transposed);
            (copies, first, second)
        }
    };
    let sets = copies.max(1);
    let tile_partials = client.empty(sets * tiles * STAT_FIELDS * 4);
    unsafe {
        tensor_stats_kernel::launch_unchecked::<R>(
            client,
            cubecl::server::CubeCountSelection::new(client, tiles as u32).cube_count(),
            CubeDim::new_1d(STATS_TILE as u32),
            ArrayArg::from_raw_parts(x.handle.clone(), words),
            first.0,
            first.1,
            second.0,
            second.1,
            row_group,
            start,
            len,
            ArrayArg::from_raw_parts(tile_partials.clone(), sets * tiles * STAT_FIELDS),
            x.rows,
            x.cols,
            tiles,
            groups,
            code_rows,
            fp8_max,
            0u32,
            f32::INFINITY,
            x.kind,
            copies,
            labels.is_some(),
            decode.0,
            decode.1,
            decode.2,
            decode.3,
            planes,
        )
    };
    let records = stats_records(x.rows, x.cols);
    let out = client.empty(sets * records * STAT_FIELDS * 4);
    unsafe {
        stats_records_kernel::launch_unchecked::<R>(
            client,
            cubecl::server::CubeCountSelection::new(client, (sets * records) as u32).cube_count(),
            CubeDim::new_1d(STATS_TILE as u32),
            ArrayArg::from_raw_parts(tile_partials, sets * tiles * STAT_FIELDS),
            ArrayArg::from_raw_parts(out.clone(), sets * records * STAT_FIELDS),
            x.rows.div_ceil(STATS_TILE),
            x.cols.div_ceil(STATS_TILE),
            records,
            sets,
            f32::INFINITY,
            planes,
        )
    };
    Ok(out)
}
