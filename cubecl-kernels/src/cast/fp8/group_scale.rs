//! The per-group steps both FP8 per-tensor cast kernels take: the group a tile lies in and the
//! scale its codes take (from the group's amax or delayed scale, or one scale shared by every
//! group), the group's amax recorded (and folded into the amax history), and every group's
//! `scale_inv`.

use cubecl::prelude::*;

use crate::cast::fp8::Fp8CastConfig;
use crate::cast::scale::scale_from_amax;
use crate::grouped::group_layout::group_of_row;
use crate::util::reduce::{cube_max_f32, cube_max_into};

/// The group of the tile starting at row `tile_row0` as `(g, first row, rows)`, whether the tile
/// lies inside it (a tile past the last group, the zero tail, has no columnwise place), and the
/// scale its codes take (`group_scale`). Uniform per cube: a tile lies in one group (groups are
/// multiples of 32 rows).
#[cube]
#[allow(clippy::too_many_arguments)]
pub(crate) fn tile_group_and_scale(
    scale_source: &Array<u32>,
    group_start: &Array<u32>,
    group_rows: &Array<u32>,
    rows: usize,
    groups: usize,
    scale_first: usize,
    scale_stride: usize,
    tile_row0: usize,
    #[comptime] config: Fp8CastConfig,
    #[comptime] units: usize,
) -> (usize, usize, usize, bool, f32) {
    let (g, g_start, g_rows) =
        group_of_row(group_start, group_rows, groups, rows, tile_row0, config.grouped);
    let in_group = tile_row0 - g_start < g_rows;
    let scale = group_scale(scale_source, g, groups, scale_first, scale_stride, config, units);
    (g, g_start, g_rows, in_group, scale)
}

/// The scale group `g`'s codes are multiplied by: from its amax (current scaling) or its delayed
/// scale; with a shared scale, from the largest amax or the smallest scale of all groups, folded
/// by the cube (so every unit of the cube must call it).
#[cube]
pub(crate) fn group_scale(
    scale_source: &Array<u32>,
    g: usize,
    groups: usize,
    scale_first: usize,
    scale_stride: usize,
    #[comptime] config: Fp8CastConfig,
    #[comptime] units: usize,
) -> f32 {
    let mut source = f32::reinterpret(scale_source[scale_first + g * scale_stride]);
    if comptime![config.shared_scale] {
        // The largest amax (current) or the smallest scale, as the max of `-scale` (delayed):
        // every unit folds a stride of the groups, the cube reduces.
        let mut key = f32::reinterpret(scale_source[scale_first]);
        if comptime![!config.from_amax] {
            key = -key;
        }
        for e in range_stepped(UNIT_POS as usize, groups, units) {
            let mut k = f32::reinterpret(scale_source[scale_first + e * scale_stride]);
            if comptime![!config.from_amax] {
                k = -k;
            }
            key = select(k > key, k, key);
        }
        let mut folded = SharedMemory::<f32>::new(units);
        source = cube_max_f32(key, &mut folded, units);
        if comptime![!config.from_amax] {
            source = -source;
        }
    }
    if comptime![config.from_amax] {
        scale_from_amax(source, config.rule)
    } else {
        source
    }
}

/// With `record_amax`, the cube's amax of group `g` into `amax_out[g]` (and, with
/// `record_history`, into row 0 of the amax history). Uniform per cube: a cast's cube lies in
/// one group.
#[cube]
#[allow(clippy::too_many_arguments)]
pub(crate) fn record_group_amax(
    local_amax: u32,
    in_group: bool,
    g: usize,
    amax_out: &mut Array<Atomic<u32>>,
    amax_history: &mut Array<Atomic<u32>>,
    history_first: usize,
    history_stride: usize,
    #[comptime] config: Fp8CastConfig,
    #[comptime] units: usize,
) {
    if comptime![config.record_amax] {
        if in_group {
            let mut scratch = SharedMemory::<u32>::new(units);
            cube_max_into(local_amax, &mut scratch, amax_out, g, units);
            if comptime![config.record_history] {
                if UNIT_POS == 0 {
                    // Unit 0 still sees the cube's maximum in `scratch[0]`.
                    amax_history[history_first + g * history_stride].fetch_max(scratch[0]);
                }
            }
        }
    }
}

/// Every group's `scale_inv`, empty groups included (cube 0 calls it); `scale` is the cube's
/// own, which every group takes with a shared scale.
#[cube]
#[allow(clippy::too_many_arguments)]
pub(crate) fn write_scale_invs(
    scale: f32,
    scale_source: &Array<u32>,
    scale_inv_out: &mut Array<u32>,
    groups: usize,
    scale_first: usize,
    scale_stride: usize,
    #[comptime] config: Fp8CastConfig,
    #[comptime] units: usize,
) {
    for e in range_stepped(UNIT_POS as usize, groups, units) {
        let mut group_scale = scale;
        if comptime![!config.shared_scale] {
            let source = f32::reinterpret(scale_source[scale_first + e * scale_stride]);
            group_scale = if comptime![config.from_amax] {
                scale_from_amax(source, config.rule)
            } else {
                source
            };
        }
        scale_inv_out[e] = u32::reinterpret(1.0f32 / group_scale);
    }
}
