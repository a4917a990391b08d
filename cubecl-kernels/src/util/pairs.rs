//! Element pairs in raw 32-bit words: the LayerNormMLP kernels (`norm`, `activation`) and the
//! NVFP4 amax read and write their tensors two elements at a time, one word of f16/bf16 or two
//! words of f32, so one kernel serves every dtype on every runtime (wgpu has no bf16 type) and
//! 16-bit stores are whole words. Stores round to nearest-even, as a cast to the dtype does: by
//! integer arithmetic on the bits (`pair_word`, `round_to`), or where the launcher allows by the
//! runtime's conversion instruction (`pair_word_by`, `round_to_by`), with the same bits but for NaN
//! payloads.

use crate::cast::codec::Fp8Encoder;
use crate::util::elements::{abs_bits_for_amax, f16_bits_to_f32, shift_right_rne, ElemKind};

use cubecl::prelude::*;
use half::{bf16, f16};

/// Elements `index` and `index + 1` (`index` even) of the raw words.
#[cube]
pub fn load_pair(input: &Array<u32>, index: usize, #[comptime] kind: ElemKind) -> (f32, f32) {
    match kind {
        ElemKind::F32 => (
            f32::reinterpret(input[index]),
            f32::reinterpret(input[index + 1]),
        ),
        _ => word_pair(input[index / 2], kind),
    }
}

/// The two elements of a word of a 16-bit kind (low half first).
#[cube]
pub fn word_pair(w: u32, #[comptime] kind: ElemKind) -> (f32, f32) {
    match kind {
        ElemKind::F16 => (f16_bits_to_f32(w & 0xFFFFu32), f16_bits_to_f32(w >> 16u32)),
        _ => (
            f32::reinterpret(w << 16u32),
            f32::reinterpret(w & 0xFFFF_0000u32),
        ),
    }
}

/// The word of a 16-bit kind holding `a` (low half) and `b`, each rounded to nearest-even.
#[cube]
pub fn pair_word(a: f32, b: f32, #[comptime] kind: ElemKind) -> u32 {
    match kind {
        ElemKind::F16 => f32_to_f16_bits(a) | (f32_to_f16_bits(b) << 16u32),
        _ => f32_to_bf16_bits(a) | (f32_to_bf16_bits(b) << 16u32),
    }
}

/// bf16 bits of `x`, rounded to nearest-even (NaN stays a quiet NaN).
#[cube]
pub fn f32_to_bf16_bits(x: f32) -> u32 {
    let bits = u32::reinterpret(x);
    let mut out = (bits + 0x7FFFu32 + ((bits >> 16u32) & 1u32)) >> 16u32;
    if (bits & 0x7FFF_FFFFu32) > 0x7F80_0000u32 {
        out = (bits >> 16u32) | 0x40u32;
    }
    out
}

/// f16 bits of `x`, rounded to nearest-even: overflow to infinity, subnormals counted in quanta
/// of 2^-24, NaN a quiet NaN.
#[cube]
pub fn f32_to_f16_bits(x: f32) -> u32 {
    let bits = u32::reinterpret(x);
    let sign = (bits >> 16u32) & 0x8000u32;
    let abs = bits & 0x7FFF_FFFFu32;
    let exponent = abs >> 23u32;
    let mut out = 0u32;
    if abs > 0x7F80_0000u32 {
        out = 0x7E00u32;
    } else if abs >= 0x477F_F000u32 {
        // 65520 and up round to infinity.
        out = 0x7C00u32;
    } else if abs >= 0x3880_0000u32 {
        // Normal f16 (2^-14 and up): rebias the exponent (127 -> 15) and round off 13 bits; a
        // carry out of the mantissa correctly bumps the exponent.
        out = shift_right_rne(abs - 0x3800_0000u32, 13u32);
    } else if exponent != 0u32 {
        // Subnormal f16: the value sig * 2^(e - 150) in quanta of 2^-24 is sig >> (126 - e).
        let significand = (abs & 0x7F_FFFFu32) | 0x80_0000u32;
        out = shift_right_rne(significand, 126u32 - exponent);
    }
    sign | out
}

/// `x` rounded to `kind` (the value a store keeps), as f32.
#[cube]
pub fn round_to(x: f32, #[comptime] kind: ElemKind) -> f32 {
    match kind {
        ElemKind::F32 => x,
        ElemKind::BF16 => f32::reinterpret(f32_to_bf16_bits(x) << 16u32),
        ElemKind::F16 => f16_bits_to_f32(f32_to_f16_bits(x)),
    }
}

/// bf16 / f16 bits of `x` by the runtime's conversion instruction (CUDA: `cvt.rn.bf16.f32`,
/// `cvt.rn.f16.f32`): the same bits as `f32_to_bf16_bits` / `f32_to_f16_bits` for every value but
/// NaN, which becomes the instruction's canonical NaN. One instruction where the integer rounding
/// takes about seven integer operations, on an INT pipe that runs at half the FP32 rate on Hopper
/// (the activation kernels round every value they store or fold).
#[cube]
fn half_bits_by_instruction(x: f32, #[comptime] kind: ElemKind) -> u32 {
    match kind {
        ElemKind::F16 => u32::cast_from(u16::reinterpret(f16::cast_from(x))),
        _ => u32::cast_from(u16::reinterpret(bf16::cast_from(x))),
    }
}

/// `pair_word`, rounding by `encoder`: the conversion instruction where the launcher found one
/// (`Fp8Encoder::Instruction`, CUDA), else the integer rounding.
#[cube]
pub fn pair_word_by(a: f32, b: f32, #[comptime] kind: ElemKind, #[comptime] encoder: Fp8Encoder) -> u32 {
    if comptime![encoder == Fp8Encoder::Instruction] {
        half_bits_by_instruction(a, kind) | (half_bits_by_instruction(b, kind) << 16u32)
    } else {
        pair_word(a, b, kind)
    }
}

/// `round_to`, rounding by `encoder` as `pair_word_by`.
#[cube]
pub fn round_to_by(x: f32, #[comptime] kind: ElemKind, #[comptime] encoder: Fp8Encoder) -> f32 {
    if comptime![encoder == Fp8Encoder::Instruction && kind != ElemKind::F32] {
        match kind {
            ElemKind::F16 => f32::cast_from(f16::cast_from(x)),
            _ => f32::cast_from(bf16::cast_from(x)),
        }
    } else {
        round_to(x, kind)
    }
}

/// Stores `a`, `b` as elements `index`, `index + 1` (`index` even), rounded to `kind`.
#[cube]
pub fn store_pair(
    output: &mut Array<u32>,
    index: usize,
    a: f32,
    b: f32,
    #[comptime] kind: ElemKind,
) {
    match kind {
        ElemKind::F32 => {
            output[index] = u32::reinterpret(a);
            output[index + 1] = u32::reinterpret(b);
        }
        _ => {
            output[index / 2] = pair_word(a, b, kind);
        }
    }
}

/// Elements a word of `kind` holds (f32: one; f16/bf16: two).
pub fn word_elements(kind: ElemKind) -> usize {
    if kind == ElemKind::F32 {
        1
    } else {
        2
    }
}

/// Element `e` (0 or 1) of word `w` of a vector of raw words, as f32 (f32 chunks have one element
/// a word, so `e` is 0 there).
#[cube]
pub fn vector_element<N: Size>(
    v: Vector<u32, N>,
    #[comptime] w: usize,
    #[comptime] e: usize,
    #[comptime] kind: ElemKind,
) -> f32 {
    if comptime![kind == ElemKind::F32] {
        f32::reinterpret(v[w])
    } else {
        let (a, b) = word_pair(v[w], kind);
        if comptime![e == 0] {
            a
        } else {
            b
        }
    }
}

/// The word a chunk of `kind` stores for two values, rounded by `encoder` (f32: `a` alone).
#[cube]
pub fn stored_word(a: f32, b: f32, #[comptime] kind: ElemKind, #[comptime] encoder: Fp8Encoder) -> u32 {
    let mut w = u32::reinterpret(a);
    if comptime![kind != ElemKind::F32] {
        w = pair_word_by(a, b, kind, encoder);
    }
    w
}

/// `local` folded with the amax bits (`abs_bits_for_amax`) of every element of a stored chunk:
/// the amax of what a store keeps, read back from its bits.
#[cube]
pub fn packed_amax<N: Size>(
    packed: Vector<u32, N>,
    local: u32,
    #[comptime] words: usize,
    #[comptime] kind: ElemKind,
) -> u32 {
    let mut m = local;
    #[unroll]
    for w in 0..words {
        #[unroll]
        for e in 0..comptime![word_elements(kind)] {
            m = max(m, abs_bits_for_amax(vector_element::<N>(packed, w, e, kind)));
        }
    }
    m
}
