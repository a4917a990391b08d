//! The element types of the high-precision tensors (`ElemKind`) and how kernels read them from
//! raw 32-bit words (one f32, or two f16/bf16, per word), so that every runtime reads every dtype
//! exactly, bf16 included; with the two bit-level helpers every kernel family shares: `|x|` for an
//! amax, and a shift that rounds to nearest even.

use crate::util::pairs::vector_element;

use cubecl::prelude::*;

/// Element type of the high-precision input, read as raw little-endian 32-bit words: one f32 per
/// word, or two 16-bit values per word (the even element in the low half).
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum ElemKind {
    F32,
    F16,
    BF16,
}

impl ElemKind {
    pub fn bytes(self) -> usize {
        match self {
            ElemKind::F32 => 4,
            ElemKind::F16 | ElemKind::BF16 => 2,
        }
    }

    /// Bits of the dtype's largest finite value, as f32 (block scaling's `value_for_inf`).
    pub fn max_finite_bits(self) -> u32 {
        match self {
            ElemKind::F32 => f32::MAX.to_bits(),
            ElemKind::F16 => 0x477F_E000,  // 65504
            ElemKind::BF16 => 0x7F7F_0000, // 3.3895e38
        }
    }
}

/// f16 bits (in the low 16 bits) to f32, exactly (subnormals through an exact product).
#[cube]
pub fn f16_bits_to_f32(h: u32) -> f32 {
    let sign = (h & 0x8000u32) << 16u32;
    let exponent = (h >> 10u32) & 0x1Fu32;
    let mantissa = h & 0x3FFu32;
    let mut bits = sign | 0x7F80_0000u32 | (mantissa << 13u32); // Inf / NaN
    if exponent == 0u32 {
        // mantissa * 2^-24: a small integer times a power of two, exact and normal in f32.
        let magnitude = f32::cast_from(mantissa) * 5.9604645e-8f32; // 2^-24
        bits = sign | u32::reinterpret(magnitude);
    } else if exponent < 31u32 {
        bits = sign | ((exponent + 112u32) << 23u32) | (mantissa << 13u32);
    }
    f32::reinterpret(bits)
}

/// Element `i` (0..8, comptime) of an 8-element chunk held in `w` (four words: 8 halves, or the
/// first four f32 of the chunk) and `w2` (the last four f32; unused for 16-bit kinds), decoded by
/// `pairs::vector_element`.
#[cube]
pub fn chunk_element<N: Size>(
    w: Vector<u32, N>,
    w2: Vector<u32, N>,
    #[comptime] i: usize,
    #[comptime] kind: ElemKind,
) -> f32 {
    if comptime![kind != ElemKind::F32] {
        vector_element::<N>(w, comptime![i / 2], comptime![i % 2], kind)
    } else if comptime![i < 4] {
        vector_element::<N>(w, i, 0usize, kind)
    } else {
        vector_element::<N>(w2, comptime![i - 4], 0usize, kind)
    }
}

/// The low (even, `high == false`) or high (odd) 16-bit element of an input word as f32, for
/// kernels that keep their input as raw words (`kind` is F16 or BF16).
#[cube]
pub fn half_of_word(word: u32, high: bool, #[comptime] kind: ElemKind) -> f32 {
    if comptime![kind == ElemKind::BF16] {
        f32::reinterpret(select(high, word & 0xFFFF_0000u32, word << 16u32))
    } else {
        f16_bits_to_f32(select(high, word >> 16u32, word & 0xFFFFu32))
    }
}

/// Reads the 8-element chunk starting at element `start` (a multiple of 8) into
/// `out[offset..offset + 8]`. The input holds 4-word vectors.
#[cube]
pub fn load_chunk<N: Size>(
    input: &Array<Vector<u32, N>>,
    start: usize,
    out: &mut Array<f32>,
    offset: usize,
    #[comptime] kind: ElemKind,
) {
    let is_f32 = comptime![kind == ElemKind::F32];
    let w = if is_f32 {
        input[start / 4]
    } else {
        input[start / 8]
    };
    let w2 = if is_f32 { input[start / 4 + 1] } else { w };
    #[unroll]
    for i in 0..8usize {
        out[offset + i] = chunk_element::<N>(w, w2, i, kind);
    }
}

/// `|x|` as bits for amax: NaN counts as 0, so a u32 max over these equals C's `fmaxf` reduction.
#[cube]
pub fn abs_bits_for_amax(x: f32) -> u32 {
    let abs = u32::reinterpret(x) & 0x7FFF_FFFFu32;
    select(abs > 0x7F80_0000u32, 0u32, abs)
}

/// `v >> shift` rounded to nearest, ties to even; shifts of 32 or more give 0.
#[cube]
pub fn shift_right_rne(v: u32, shift: u32) -> u32 {
    let mut result = 0u32;
    if shift == 0u32 {
        result = v;
    } else if shift < 32u32 {
        let quotient = v >> shift;
        let remainder = v & ((1u32 << shift) - 1u32);
        let half = 1u32 << (shift - 1u32);
        result = quotient;
        if remainder > half || (remainder == half && (quotient & 1u32) == 1u32) {
            result = quotient + 1u32;
        }
    }
    result
}
