//! Buffer utilities: fill (zeroing scale padding and amax accumulators) and a plain vectorized
//! copy, the bandwidth yardstick the benchmarks compare quantize kernels against.

use cubecl::prelude::*;

/// Fills a u32 buffer with `value`.
#[cube(launch_unchecked)]
pub fn fill_kernel(out: &mut Array<u32>, value: u32) {
    if ABSOLUTE_POS < out.len() {
        out[ABSOLUTE_POS] = value;
    }
}

/// Copies 16-byte vectors.
#[cube(launch_unchecked)]
pub fn copy_kernel<N: Size>(input: &Array<Vector<u32, N>>, out: &mut Array<Vector<u32, N>>) {
    if ABSOLUTE_POS < out.len() {
        out[ABSOLUTE_POS] = input[ABSOLUTE_POS];
    }
}

/// `out[i · stride] = input[i]` and zero between: one value per `stride` words (cuBLASLt wants
/// each per-group FP8 scale at its own 16-byte aligned address).
#[cube(launch_unchecked)]
pub fn spread_words_kernel(input: &Array<u32>, out: &mut Array<u32>, stride: usize) {
    if ABSOLUTE_POS < out.len() {
        let mut value = 0u32;
        if ABSOLUTE_POS % stride == 0 {
            value = input[ABSOLUTE_POS / stride];
        }
        out[ABSOLUTE_POS] = value;
    }
}

/// Copies `out.len()` words starting at word `offset` of `input`.
#[cube(launch_unchecked)]
pub fn copy_words_kernel(input: &Array<u32>, out: &mut Array<u32>, offset: usize) {
    if ABSOLUTE_POS < out.len() {
        out[ABSOLUTE_POS] = input[offset + ABSOLUTE_POS];
    }
}
