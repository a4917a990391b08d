//! Tensor amax (`max |x|`, NaN skipped): the first pass of FP8 current scaling and of NVFP4.
//! The NVFP4 variant also takes the amax of the RHT-transformed transpose in the same read.
//! Results are f32 bit patterns, reduced with an atomic u32 max (non-negative floats order like
//! their bits), into buffers the caller zeroes first.

use crate::codec::{abs_bits_for_amax, f16_bits_to_f32, load_chunk, ElemKind};
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

/// Elements `index` and `index + 1` (`index` even) of the raw input words.
#[cube]
fn load_pair(input: &Array<u32>, index: usize, #[comptime] kind: ElemKind) -> (f32, f32) {
    match kind {
        ElemKind::F32 => (
            f32::reinterpret(input[index]),
            f32::reinterpret(input[index + 1]),
        ),
        ElemKind::BF16 => {
            let w = input[index / 2];
            (
                f32::reinterpret(w << 16u32),
                f32::reinterpret(w & 0xFFFF_0000u32),
            )
        }
        ElemKind::F16 => {
            let w = input[index / 2];
            (f16_bits_to_f32(w & 0xFFFFu32), f16_bits_to_f32(w >> 16u32))
        }
    }
}

/// Rowwise amax of `x [rows, cols]` and amax of `RHT(xᵀ)` (16-element chunks along M), in one
/// read. Each unit folds (16 rows x 2 columns) pieces, consecutive units taking consecutive
/// column pairs so that each row read is coalesced. `rows % 16 == 0`, `cols % 2 == 0`.
#[cube(launch_unchecked)]
pub fn amax_rht_kernel(
    input: &Array<u32>,
    out_rowwise: &mut Array<Atomic<u32>>,
    out_rht: &mut Array<Atomic<u32>>,
    rows: usize,
    cols: usize,
    #[comptime] kind: ElemKind,
) {
    let pairs = cols / 2;
    let pieces = (rows / 16) * pairs;
    let mut a = Array::<f32>::new(16usize);
    let mut b = Array::<f32>::new(16usize);
    let mut local = 0u32;
    let mut local_rht = 0u32;
    let stride = CUBE_COUNT * comptime![AMAX_UNITS];
    for piece in range_stepped(ABSOLUTE_POS, pieces, stride) {
        let row0 = (piece / pairs) * 16;
        let col0 = (piece % pairs) * 2;
        #[unroll]
        for i in 0..16usize {
            let (x, y) = load_pair(input, (row0 + i) * cols + col0, kind);
            a[i] = x;
            b[i] = y;
            let m = max(abs_bits_for_amax(x), abs_bits_for_amax(y));
            local = select(m > local, m, local);
        }
        rht16(&mut a, 0usize, 1usize, kind);
        rht16(&mut b, 0usize, 1usize, kind);
        #[unroll]
        for i in 0..16usize {
            let m = max(abs_bits_for_amax(a[i]), abs_bits_for_amax(b[i]));
            local_rht = select(m > local_rht, m, local_rht);
        }
    }
    let mut scratch = SharedMemory::<u32>::new(AMAX_UNITS);
    cube_max_into(local, &mut scratch, out_rowwise, AMAX_UNITS);
    sync_cube();
    cube_max_into(local_rht, &mut scratch, out_rht, AMAX_UNITS);
}
