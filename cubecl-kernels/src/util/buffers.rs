//! Device buffers: the array arguments launchers build over them, and the small kernels that
//! fill them (zeroing scale padding and amax accumulators) and copy them (a plain vectorized
//! copy, the bandwidth yardstick the benchmarks compare quantize kernels against; word ranges;
//! values spread to aligned slots), each with its launcher.

use cubecl::prelude::*;
use cubecl::server::Handle;

use crate::util::grid::{ceil_div, linear_cubes};
use crate::util::matrix::INPUT_VECTOR;
use crate::util::zeroed::zeroed_words;

/// An array argument over the first `words` words of `handle` (at least one).
pub(crate) fn arg<R: Runtime>(handle: &Handle, words: usize) -> ArrayArg<R> {
    unsafe { ArrayArg::from_raw_parts(handle.clone(), words.max(1)) }
}

/// A placeholder for a buffer argument the kernel does not read (or a direction not asked for).
pub(crate) fn dummy<R: Runtime>(client: &ComputeClient<R>) -> Handle {
    client.empty(16)
}

/// Fills a u32 buffer with `value`.
#[cube(launch_unchecked)]
pub fn fill_kernel(out: &mut Array<u32>, value: u32) {
    if ABSOLUTE_POS < out.len() {
        out[ABSOLUTE_POS] = value;
    }
}

/// Zero-filled requests up to this many words come from `zeroed::zeroed_words`'s arena (no
/// launch of their own).
const ARENA_WORDS: usize = 1024;

/// A buffer of `words` u32 set to `value` on the device (no host copy). Small zeroed buffers (the
/// amaxes' accumulators) are slots of an arena zeroed by one launch for many of them.
pub fn filled<R: Runtime>(client: &ComputeClient<R>, words: usize, value: u32) -> Handle {
    if value == 0 && words <= ARENA_WORDS {
        return zeroed_words(client, words);
    }
    let handle = client.empty(words.max(1) * 4);
    fill(client, &handle, words.max(1), value);
    handle
}

/// Sets the first `words` u32 of `handle` (a buffer or a view) to `value`.
pub fn fill<R: Runtime>(client: &ComputeClient<R>, handle: &Handle, words: usize, value: u32) {
    if words == 0 {
        return;
    }
    let units = 256usize;
    unsafe {
        fill_kernel::launch_unchecked::<R>(
            client,
            linear_cubes(client, ceil_div(words, units)),
            CubeDim::new_1d(units as u32),
            ArrayArg::from_raw_parts(handle.clone(), words),
            value,
        )
    };
}

/// Copies 16-byte vectors.
#[cube(launch_unchecked)]
pub fn copy_kernel<N: Size>(input: &Array<Vector<u32, N>>, out: &mut Array<Vector<u32, N>>) {
    if ABSOLUTE_POS < out.len() {
        out[ABSOLUTE_POS] = input[ABSOLUTE_POS];
    }
}

/// Copies `bytes` (a multiple of 16) from `input` into a new buffer: the device-copy baseline.
pub fn copy<R: Runtime>(client: &ComputeClient<R>, input: &Handle, bytes: usize) -> Handle {
    let out = client.empty(bytes);
    let words = bytes / 4;
    let units = 256usize;
    unsafe {
        copy_kernel::launch_unchecked::<R>(
            client,
            linear_cubes(client, ceil_div(words / INPUT_VECTOR, units)),
            CubeDim::new_1d(units as u32),
            INPUT_VECTOR,
            arg(input, words),
            arg(&out, words),
        )
    };
    out
}

/// Copies `out.len()` words starting at word `offset` of `input`.
#[cube(launch_unchecked)]
pub fn copy_words_kernel(input: &Array<u32>, out: &mut Array<u32>, offset: usize) {
    if ABSOLUTE_POS < out.len() {
        out[ABSOLUTE_POS] = input[offset + ABSOLUTE_POS];
    }
}

/// Copies bytes `offset .. offset + len` of `input` (both multiples of 4) into a new buffer.
pub fn copy_range<R: Runtime>(
    client: &ComputeClient<R>,
    input: &Handle,
    offset: usize,
    len: usize,
) -> Handle {
    assert!(offset % 4 == 0 && len % 4 == 0, "word-aligned byte range {offset}+{len}");
    let out = client.empty(len.max(4));
    let words = len / 4;
    let units = 256usize;
    unsafe {
        copy_words_kernel::launch_unchecked::<R>(
            client,
            linear_cubes(client, ceil_div(words.max(1), units)),
            CubeDim::new_1d(units as u32),
            arg(input, (offset + len) / 4),
            arg(&out, words),
            offset / 4,
        )
    };
    out
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

/// The `count` words of `input` spread to one per `stride` words (zeros between), in a new buffer.
pub fn spread_words<R: Runtime>(
    client: &ComputeClient<R>,
    input: &Handle,
    count: usize,
    stride: usize,
) -> Handle {
    let words = count * stride;
    let out = client.empty(words.max(1) * 4);
    let units = 256usize;
    unsafe {
        spread_words_kernel::launch_unchecked::<R>(
            client,
            linear_cubes(client, ceil_div(words.max(1), units)),
            CubeDim::new_1d(units as u32),
            arg(input, count),
            arg(&out, words),
            stride,
        )
    };
    out
}
