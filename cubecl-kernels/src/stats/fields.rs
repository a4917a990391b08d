//! How the statistics kernels fold values into a tile's fields (`STAT_FIELDS` f32 per unit:
//! sums, counts, extremes, ranges and the quantization terms) and reduce the units' fields over
//! the cube, by warp shuffles or through shared memory along the same trees.

use cubecl::prelude::*;

use crate::stats::{
    ABS_SUM, AMAX, ELEMENTS, GROUP, LN_RANGE_2D, MAX, MAX_LN_RANGE_1D, MIN, MIN_NONZERO_ABS,
    NONZERO, OVERFLOWS, SQUARED_ERROR, STATS_TILE, STAT_FIELDS, SUM, SUM_SQUARES, UNDERFLOWS,
};
use crate::util::reduce::{cube_max_f32, cube_sum, plane_tree_max, plane_tree_sum};

/// `ln(amax) - ln(min non-zero)` of a block, 0 for a block of zeros.
#[cube]
pub(crate) fn ln_range(amax: f32, min_nonzero: f32) -> f32 {
    let mut r = 0.0f32;
    if amax > 0.0f32 {
        r = f32::ln(amax) - f32::ln(min_nonzero);
    }
    r
}

/// One element's contribution to a unit's accumulators (see the field docs).
#[cube]
pub(crate) fn fold_value(v: f32, acc: &mut Array<f32>) {
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
pub(crate) fn fold_error(v: f32, d: f32, limit: f32, infinity: f32, acc: &mut Array<f32>) {
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
pub(crate) fn empty_fields(acc: &mut Array<f32>, infinity: f32) {
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
pub(crate) fn tile_sum(value: f32, scratch: &mut SharedMemory<f32>, #[comptime] planes: bool) -> f32 {
    if comptime![planes] {
        plane_tree_sum(value)
    } else {
        cube_sum(value, scratch, STATS_TILE)
    }
}

/// Max over the cube of 32 units (`cube_max_f32`'s tree; by plane shuffles with `planes`).
#[cube]
pub(crate) fn tile_max(value: f32, scratch: &mut SharedMemory<f32>, #[comptime] planes: bool) -> f32 {
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
pub(crate) fn cube_fold_fields(
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
