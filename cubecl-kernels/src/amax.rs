//! Tensor amax (`max |x|`, NaN skipped): the first pass of FP8 current scaling and of NVFP4.
//! The NVFP4 variant also takes the amax of the RHT-transformed transpose in the same read.
//! Results are f32 bit patterns, reduced with an atomic u32 max (non-negative floats order like
//! their bits), into buffers the caller zeroes first.

use crate::codec::{abs_bits_for_amax, load_chunk, ElemKind};
use crate::hadamard::rht16;
use crate::reduce::cube_max_into;
use cubecl::prelude::*;

/// Units per cube of the amax kernels.
pub const AMAX_UNITS: usize = 256;

/// Each unit folds 8-element chunks `ABSOLUTE_POS, + stride, ...` of the flat input.
#[cube(launch_unchecked)]
pub fn amax_kernel<N: Size>(
    input: &Array<Vector<u32, N>>,
    out: &mut Array<Atomic<u32>>,
    num_chunks: usize,
    #[comptime] kind: ElemKind,
) {
    let mut values = Array::<f32>::new(8usize);
    let mut local = 0u32;
    let stride = CUBE_COUNT * comptime![AMAX_UNITS];
    for chunk in range_stepped(ABSOLUTE_POS, num_chunks, stride) {
        load_chunk::<N>(input, chunk * 8, &mut values, 0usize, kind);
        #[unroll]
        for i in 0..8usize {
            let a = abs_bits_for_amax(values[i]);
            if a > local {
                local = a;
            }
        }
    }
    let mut scratch = SharedMemory::<u32>::new(AMAX_UNITS);
    cube_max_into(local, &mut scratch, out, AMAX_UNITS);
}

/// Rowwise amax of `x [rows, cols]` and amax of `RHT(xᵀ)` (16-element chunks along M), in one
/// read. Each unit folds 16x8 sub-tiles: tile `t` covers rows `16 * (t / strips)..` and columns
/// `8 * (t % strips)..`. `rows % 16 == 0`, `cols % 8 == 0`.
#[cube(launch_unchecked)]
pub fn amax_rht_kernel<N: Size>(
    input: &Array<Vector<u32, N>>,
    out_rowwise: &mut Array<Atomic<u32>>,
    out_rht: &mut Array<Atomic<u32>>,
    rows: usize,
    cols: usize,
    #[comptime] kind: ElemKind,
    #[comptime] unroll: bool,
) {
    let strips = cols / 8;
    let num_tiles = (rows / 16) * strips;
    let mut values = Array::<f32>::new(128usize);
    let mut local = 0u32;
    let mut local_rht = 0u32;
    let stride = CUBE_COUNT * comptime![AMAX_UNITS];
    for tile in range_stepped(ABSOLUTE_POS, num_tiles, stride) {
        let row0 = (tile / strips) * 16;
        let col0 = (tile % strips) * 8;
        #[unroll(unroll)]
        for i in 0..16usize {
            load_chunk::<N>(input, (row0 + i) * cols + col0, &mut values, i * 8, kind);
        }
        #[unroll(unroll)]
        for i in 0..128usize {
            let a = abs_bits_for_amax(values[i]);
            if a > local {
                local = a;
            }
        }
        #[unroll(unroll)]
        for j in 0..8usize {
            rht16(&mut values, j, 8usize, kind);
        }
        #[unroll(unroll)]
        for i in 0..128usize {
            let a = abs_bits_for_amax(values[i]);
            if a > local_rht {
                local_rht = a;
            }
        }
    }
    let mut scratch = SharedMemory::<u32>::new(AMAX_UNITS);
    cube_max_into(local, &mut scratch, out_rowwise, AMAX_UNITS);
    sync_cube();
    cube_max_into(local_rht, &mut scratch, out_rht, AMAX_UNITS);
}
