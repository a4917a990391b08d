//! `tensor_stats_kernel`: one cube per 32x32 tile of the tensor, each unit one row of it, writing
//! the tile's partial statistics, with the quantization terms against a dequantized copy or FP8
//! codes decoded in the pass.

use cubecl::prelude::*;

use crate::cast::codec::Fp8Kind;
use crate::cast::dequantize::fp8_grouped_element;
use crate::stats::{
    AMAX, ELEMENTS, GROUP, LN_RANGE_2D, MAX_LN_RANGE_1D, MIN_NONZERO_ABS, OVERFLOWS, SQUARED_ERROR,
    STATS_TILE, STAT_FIELDS, UNDERFLOWS,
};
use crate::stats::fields::{
    cube_fold_fields, empty_fields, fold_error, fold_value, ln_range, tile_sum,
};
use crate::util::elements::ElemKind;
use crate::util::pairs::load_pair;

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
