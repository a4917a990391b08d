//! Cube counts: how many cubes a launch takes and how they are laid out within the hardware's
//! limits.

use cubecl::prelude::*;

/// A cube count of at least `cubes` cubes, spread over dimensions within the hardware limits
/// (kernels index with ABSOLUTE_POS and check bounds, so extra cubes idle).
pub(crate) fn linear_cubes<R: Runtime>(client: &ComputeClient<R>, cubes: usize) -> CubeCount {
    cubecl::server::CubeCountSelection::new(client, cubes.max(1) as u32).cube_count()
}

pub(crate) fn ceil_div(a: usize, b: usize) -> usize {
    a.div_ceil(b)
}

pub(crate) fn round_up(a: usize, b: usize) -> usize {
    a.div_ceil(b) * b
}

/// Cubes for a grid-stride pass over `work` items.
pub(crate) fn stride_cubes<R: Runtime>(client: &ComputeClient<R>, work: usize, units: usize) -> u32 {
    let sms = client
        .properties()
        .hardware
        .num_streaming_multiprocessors
        .unwrap_or(16) as usize;
    ceil_div(work, units).clamp(1, sms.max(1) * 8) as u32
}
