//! Cube-wide reductions (sums, maxima, atomic maxima of amax bits), in fixed trees so that
//! results do not depend on scheduling; used by the casts, norm, statistics, routing and optimizer
//! kernels.

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

/// `cube_sum` of a cube that is one plane of 32 units, by warp shuffles instead of shared memory
/// and barriers: the same tree (at each level unit i adds unit i + stride, the lanes that the
/// next level reads computed exactly as in `cube_sum`), so the same sum bit for bit; every unit
/// gets lane 0's total. Only where planes are 32 lanes wide (`planes_of_32`).
#[cube]
pub fn plane_tree_sum(value: f32) -> f32 {
    let mut v = value;
    #[unroll]
    for level in 0..5u32 {
        let stride = comptime![16u32 >> level];
        v += plane_shuffle_down(v, stride);
    }
    plane_broadcast(v, 0u32)
}

/// `cube_max_f32` of a cube that is one plane of 32 units, by the same tree as `plane_tree_sum`.
#[cube]
pub fn plane_tree_max(value: f32) -> f32 {
    let mut v = value;
    #[unroll]
    for level in 0..5u32 {
        let stride = comptime![16u32 >> level];
        let other = plane_shuffle_down(v, stride);
        if other > v {
            v = other;
        }
    }
    plane_broadcast(v, 0u32)
}

/// Whether `client`'s planes (warps) are exactly 32 units wide with plane operations, so that a
/// cube of 32 units can reduce with `plane_tree_sum` / `plane_tree_max` (CUDA; lavapipe's
/// subgroups are narrower and keep the shared-memory tree).
pub fn planes_of_32<R: Runtime>(client: &ComputeClient<R>) -> bool {
    let props = client.properties();
    props.features.plane.contains(cubecl::features::Plane::Ops)
        && props.hardware.plane_size_min == 32
        && props.hardware.plane_size_max == 32
}
