//! `Σ x²` of a tensor in f32 (the gradient norm of AdamW's clipping), in two launches: cube b
//! sums the squares of its strided share of element pairs (read in the tensor's own dtype, no
//! f32 copy) and reduces them in `cube_sum`'s fixed tree into `partials[b]`; one unit then adds
//! the partials in order (`partial_sums`). Burn's `square().sum()` casts, squares and sums in
//! three launches, its sum a shared-memory kernel that took 128 µs per gradient on an H100.
//! The order of the terms differs from Burn's; it is fixed for a given size.

use cubecl::prelude::*;
use cubecl::server::Handle;

use crate::util::buffers::arg;
use crate::util::elements::ElemKind;
use crate::util::pairs::load_pair;
use crate::util::partial_sums::column_partials_sum;
use crate::util::reduce::cube_sum;

const UNITS: usize = 256;
/// The most cubes of the first pass (each unit then takes several pairs).
const MAX_BLOCKS: usize = 512;
/// Pairs a unit loads before it adds them, each into its own sum: with one 4-byte load per
/// iteration feeding one running sum, the pass ran at about 40 % of the H100's bandwidth (3.1 ms
/// per step of the 1.9B MoE example for 3.8 GB of gradients, CUPTI trace,
/// `benches/results/trace-h100/call5`).
const IN_FLIGHT: usize = 8;
// The sums are added in a tree written out for eight.
const _: () = assert!(IN_FLIGHT == 8);

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
        let stride = blocks * UNITS;
        let mut sums = Array::<f32>::new(IN_FLIGHT);
        #[unroll]
        for j in 0..IN_FLIGHT {
            sums[j] = 0.0f32;
        }
        // Unit u takes pairs u, u + stride, ...; eight of them per step, loaded together.
        for p in range_stepped(block * UNITS + UNIT_POS as usize, pairs, IN_FLIGHT * stride) {
            #[unroll]
            for j in 0..IN_FLIGHT {
                let q = p + j * stride;
                if q < pairs {
                    let (a, b) = load_pair(x, 2 * q, kind);
                    sums[j] += a * a + b * b;
                }
            }
        }
        // A fixed tree over the eight sums: the order depends only on the size.
        local = ((sums[0] + sums[1]) + (sums[2] + sums[3])) + ((sums[4] + sums[5]) + (sums[6] + sums[7]));
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
    column_partials_sum(client, &partials, blocks, 1)
}
