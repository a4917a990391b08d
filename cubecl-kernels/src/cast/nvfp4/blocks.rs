//! The in-kernel steps the NVFP4 kernels share: block amaxes (skipping NaN, or clearing it for
//! the branch-free encoder) and the E2M1 encoding of 8 or 16 values under a block's multiplier,
//! rounded to nearest or stochastically.

use cubecl::prelude::*;

use crate::cast::codec::{encode_e2m1, encode_e2m1_not_nan};
use crate::cast::random::random_word;
use crate::util::elements::abs_bits_for_amax;

/// TE's software stochastic rounding to the E2M1 grid (see the host reference).
#[cube]
pub fn stochastic_round_e2m1(x: f32, random: u32) -> u32 {
    let a = f32::reinterpret(u32::reinterpret(x) & 0x7FFF_FFFFu32);
    let u = f32::cast_from(random) * 0.00390625f32; // r / 256
    let step = select(a >= 4.0f32, 2.0f32, select(a >= 2.0f32, 1.0f32, 0.5f32));
    let t = a + u * step;
    let step_t = select(t >= 4.0f32, 2.0f32, select(t >= 2.0f32, 1.0f32, 0.5f32));
    let inverse_step_t = select(t >= 4.0f32, 0.5f32, select(t >= 2.0f32, 1.0f32, 2.0f32));
    let q = ((t * inverse_step_t).floor() * step_t).min(6.0f32);
    let mut code = 0u32;
    if !x.is_nan() {
        code = encode_e2m1_not_nan(select(x < 0.0f32, -q, q));
    }
    code
}

/// Encodes the 8 values `v[offset..offset + 8]` with multiplier `enc` into one word of packed
/// E2M1 codes (element i in bits 4i..4i+4). Element `i`'s random bits are byte `i % 4` of draw
/// `first_index / 4 + i / 4`, as the host reference's `random_byte(key, first_index + i)`
/// (`burn_lowp::format::random`) takes them, so `first_index` must be a multiple of 4 (every
/// caller's is a multiple of 8): each draw is computed once for its four elements instead of
/// once per element. `nan_free`: the values hold no NaN (the caller replaced
/// them by +0), so round-to-nearest takes `encode_e2m1_not_nan`.
#[cube]
pub(crate) fn encode_word8(
    v: &Array<f32>,
    offset: usize,
    enc: f32,
    #[comptime] stochastic: bool,
    key: u32,
    first_index: u32,
    #[comptime] nan_free: bool,
) -> u32 {
    let mut word = 0u32;
    #[unroll]
    for quad in 0..2usize {
        let mut draw = 0u32;
        if comptime![stochastic] {
            draw = random_word(key, first_index / 4u32 + comptime![quad as u32]);
        }
        #[unroll]
        for b in 0..4usize {
            let i = comptime![quad * 4 + b];
            let x = v[offset + i] * enc;
            let code = if comptime![stochastic] {
                stochastic_round_e2m1(x, (draw >> comptime![8 * b as u32]) & 0xFFu32)
            } else if comptime![nan_free] {
                encode_e2m1_not_nan(x)
            } else {
                encode_e2m1(x)
            };
            word |= code << comptime![4 * i as u32];
        }
    }
    word
}

/// Encodes 16 values `v[0..16]` into two words (see `encode_word8`).
#[cube]
pub(crate) fn encode_block16(
    v: &Array<f32>,
    enc: f32,
    #[comptime] stochastic: bool,
    key: u32,
    first_index: u32,
) -> (u32, u32) {
    (
        encode_word8(v, 0usize, enc, stochastic, key, first_index, false),
        encode_word8(v, 8usize, enc, stochastic, key, first_index + 8u32, false),
    )
}

/// The NaN-skipping amax (as bits) of `v[offset..offset + n]`, leaving the values NaN-free for
/// `encode_e2m1_not_nan`: an integer max over the sign-cleared bits, and only where that finds a
/// NaN (bits above +inf; rare) the NaNs are replaced by +0, which encodes to NaN's code 0 and
/// which the amax skips, and the max is taken again. `block_amax16` spends four ALU
/// instructions an element on NaN checks; this spends two.
#[cube]
pub(crate) fn nan_free_amax(v: &mut Array<f32>, offset: usize, #[comptime] n: usize) -> u32 {
    let mut m = 0u32;
    #[unroll]
    for i in 0..n {
        m = max(m, u32::reinterpret(v[offset + i]) & 0x7FFF_FFFFu32);
    }
    if m > 0x7F80_0000u32 {
        m = 0u32;
        #[unroll]
        for i in 0..n {
            m = max(m, abs_bits_for_amax(v[offset + i]));
        }
        clear_nans(v, offset, n);
    }
    m
}

/// Replaces the NaNs of `v[offset..offset + n]` by +0 (their code, 0, is NaN's).
#[cube]
pub(crate) fn clear_nans(v: &mut Array<f32>, offset: usize, #[comptime] n: usize) {
    #[unroll]
    for i in 0..n {
        let x = v[offset + i];
        v[offset + i] = select(x.is_nan(), 0.0f32, x);
    }
}

#[cube]
pub(crate) fn block_amax16(v: &Array<f32>) -> u32 {
    let mut m = 0u32;
    #[unroll]
    for i in 0..16usize {
        let a = abs_bits_for_amax(v[i]);
        m = select(a > m, a, m);
    }
    m
}
