//! Cube-wide reductions used by the quantize kernels.

use cubecl::prelude::*;

/// Max over the cube of every unit's `value`, then one atomic max into `out[index]`. Every unit of
/// the cube must call it (it synchronizes). `scratch` holds `units` u32; afterwards unit 0 may
/// read the maximum in `scratch[0]` (no unit writes it after the last barrier).
#[cube]
pub fn cube_max_into(
    value: u32,
    scratch: &mut SharedMemory<u32>,
    out: &Array<Atomic<u32>>,
    index: usize,
    #[comptime] units: usize,
) {
    let unit = UNIT_POS as usize;
    scratch[unit] = value;
    sync_cube();
    #[unroll]
    for level in 0..10u32 {
        let stride = comptime![units >> (level + 1)];
        if comptime![stride > 0] {
            if unit < stride {
                let other = scratch[unit + stride];
                if other > scratch[unit] {
                    scratch[unit] = other;
                }
            }
            sync_cube();
        }
    }
    if unit == 0 {
        out[index].fetch_max(scratch[0]);
    }
}

/// Sum over the cube of every unit's `value`, returned to every unit. The tree's order is fixed
/// (unit i adds unit i + stride), so a row's sum does not depend on scheduling. Every unit of the
/// cube must call it (it synchronizes, also before returning, so `scratch` can be reused at once).
#[cube]
pub fn cube_sum(value: f32, scratch: &mut SharedMemory<f32>, #[comptime] units: usize) -> f32 {
    let unit = UNIT_POS as usize;
    scratch[unit] = value;
    sync_cube();
    #[unroll]
    for level in 0..10u32 {
        let stride = comptime![units >> (level + 1)];
        if comptime![stride > 0] {
            if unit < stride {
                scratch[unit] = scratch[unit] + scratch[unit + stride];
            }
            sync_cube();
        }
    }
    let total = scratch[0];
    sync_cube();
    total
}

/// Max over the cube of every unit's f32 `value` (never NaN), returned to every unit; it
/// synchronizes, also before returning, so `scratch` can be reused at once.
#[cube]
pub fn cube_max_f32(value: f32, scratch: &mut SharedMemory<f32>, #[comptime] units: usize) -> f32 {
    let unit = UNIT_POS as usize;
    scratch[unit] = value;
    sync_cube();
    #[unroll]
    for level in 0..10u32 {
        let stride = comptime![units >> (level + 1)];
        if comptime![stride > 0] {
            if unit < stride {
                let other = scratch[unit + stride];
                if other > scratch[unit] {
                    scratch[unit] = other;
                }
            }
            sync_cube();
        }
    }
    let total = scratch[0];
    sync_cube();
    total
}
