//! `Σ x²` of a tensor in f32 (the gradient norm of AdamW's clipping), in two launches: cube b
//! sums the squares of its strided share of element pairs (read in the tensor's own dtype, no
//! f32 copy) and reduces them in `cube_sum`'s fixed tree into `partials[b]`; one unit then adds
//! the partials in order (`partial_sums`). Burn's `square().sum()` casts, squares and sums in
//! three launches, its sum a shared-memory kernel that took 128 µs per gradient on an H100.
//! The order of the terms differs from Burn's; it is fixed for a given size.

use cubecl::prelude::*;
use cubecl::server::Handle;

use crate::codec::ElemKind;
use crate::norm::arg;
use crate::pairs::load_pair;
use crate::reduce::cube_sum;

const UNITS: usize = 256;
/// The most cubes of the first pass (each unit then takes several pairs).
const MAX_BLOCKS: usize = 512;

#[cube(launch_unchecked)]
pub fn sum_squares_partials_kernel(
    x: &Array<u32>,
    partials: &mut Array<f32>,
    pairs: usize,
    blocks: usize,
    #[comptime] kind: ElemKind,
) {
    let mut scratch = SharedMemory::<f32>::new(UNITS);
    let block = CUBE_POS as usize;
    let mut local = 0.0f32;
    if block < blocks {
        for p in range_stepped(block * UNITS + UNIT_POS as usize, pairs, blocks * UNITS) {
            let (a, b) = load_pair(x, 2 * p, kind);
            local += a * a + b * b;
        }
    }
    let total = cube_sum(local, &mut scratch, UNITS);
    if block < blocks && UNIT_POS == 0 {
        partials[block] = total;
    }
}

/// f32 `[1]`: `Σ x²` over the `n` elements (n even) of `x` (words of `kind`).
pub fn sum_squares<R: Runtime>(client: &ComputeClient<R>, x: &Handle, n: usize, kind: ElemKind) -> Handle {
    let pairs = n / 2;
    let blocks = pairs.div_ceil(UNITS * 8).clamp(1, MAX_BLOCKS);
    let partials = client.empty(4 * blocks);
    let words = (n * kind.bytes()).div_ceil(4);
    unsafe {
        sum_squares_partials_kernel::launch_unchecked::<R>(
            client,
            cubecl::server::CubeCountSelection::new(client, blocks as u32).cube_count(),
            CubeDim::new_1d(UNITS as u32),
            arg(x, words),
            arg(&partials, blocks),
            pairs,
            blocks,
            kind,
        )
    };
    crate::partial_sums::column_partials_sum(client, &partials, blocks, 1)
}
