//! In-kernel scalar codecs: f32 to FP8 / E2M1 codes and back, E8M0 and E4M3 block scales, and
//! rounding to the input dtype. Each function mirrors `burn_lowp::format::codec` step for step,
//! with u32 arithmetic on the bit patterns, so that every runtime produces the reference's bytes.

use crate::util::elements::{f16_bits_to_f32, shift_right_rne, ElemKind};

use cubecl::prelude::*;
use cubecl::{e4m3, e5m2};

/// An 8-bit float element format.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum Fp8Kind {
    E4M3,
    E5M2,
}

impl Fp8Kind {
    pub fn mantissa_bits(self) -> u32 {
        match self {
            Fp8Kind::E4M3 => 3,
            Fp8Kind::E5M2 => 2,
        }
    }

    pub fn bias(self) -> u32 {
        match self {
            Fp8Kind::E4M3 => 7,
            Fp8Kind::E5M2 => 15,
        }
    }

    /// Code of the largest finite magnitude.
    pub fn max_code(self) -> u32 {
        match self {
            Fp8Kind::E4M3 => 0x7E,
            Fp8Kind::E5M2 => 0x7B,
        }
    }

    /// f32 bits of the smallest normal, 2^(1 - bias).
    pub fn min_normal_bits(self) -> u32 {
        (128 - self.bias()) << 23
    }

    pub fn max_bits(self) -> u32 {
        match self {
            Fp8Kind::E4M3 => 0x43E0_0000, // 448
            Fp8Kind::E5M2 => 0x4760_0000, // 57344
        }
    }
}

/// Magnitude code of a finite, non-saturating `|x|` (bits) in a minifloat with `mantissa_bits`
/// and `bias`: the shared core of the FP8 and E2M1 encoders.
#[cube]
pub fn encode_magnitude(
    abs: u32,
    #[comptime] mantissa_bits: u32,
    #[comptime] bias: u32,
    #[comptime] max_code: u32,
) -> u32 {
    let exponent = abs >> 23u32;
    // f32 biased exponent of the target's smallest normal: 127 + (1 - bias).
    let min_normal = comptime![128 - bias];
    // Target subnormal: count quanta of 2^(emin - m): the f32 value is sig * 2^(e - 150), so the
    // count is sig >> ((emin - m + 23) - (e - 127)) = sig >> ((151 - bias - m) - e).
    let significand = (abs & 0x7F_FFFFu32) | select(exponent != 0u32, 0x80_0000u32, 0u32);
    let e = select(exponent == 0u32, 1u32, exponent);
    let subnormal = shift_right_rne(significand, comptime![151 - bias - mantissa_bits] - e);
    // Normal: keep m mantissa bits (a carry bumps the exponent), then rebias the exponent.
    let normal = shift_right_rne(abs, comptime![23 - mantissa_bits])
        - comptime![(127 - bias) << mantissa_bits];
    let magnitude = select(exponent < min_normal, subnormal, normal);
    select(magnitude > max_code, max_code, magnitude)
}

/// FP8 encode: round to nearest even, saturate to the largest finite value, NaN -> 0x7F.
///
/// This runs once per element and integer throughput bounds the kernels, so the common case is a
/// handful of integer ops: normal results round on the bit pattern (`(abs + half - 1 + lsb) >>
/// shift`, a carry bumping the exponent), and a `min` saturates (anything at or above the largest
/// finite value, infinity included, lands on or past its code). Results below the smallest normal
/// take a (rarely entered) branch that shifts the significand with round-to-nearest-even. Integer
/// arithmetic throughout: CubeCL's optimizer may fold a float `(a + c) - c` rounding trick.
#[cube]
pub fn encode_fp8(x: f32, #[comptime] kind: Fp8Kind) -> u32 {
    let bits = u32::reinterpret(x);
    let abs = bits & 0x7FFF_FFFFu32;
    let shift = comptime![23 - kind.mantissa_bits()];
    let lsb = (abs >> shift) & 1u32;
    let rounded = (abs + comptime![(1u32 << (22 - kind.mantissa_bits())) - 1] + lsb) >> shift;
    let mut magnitude = min(
        rounded - comptime![(127 - kind.bias()) << kind.mantissa_bits()],
        comptime![kind.max_code()],
    );
    if abs < comptime![kind.min_normal_bits()] {
        magnitude = subnormal_quanta(abs, comptime![151 - kind.bias() - kind.mantissa_bits()]);
    }
    select(
        abs > 0x7F80_0000u32,
        0x7Fu32,
        magnitude | ((bits >> 24u32) & 0x80u32),
    )
}

/// How a kernel turns f32 into FP8 codes; chosen per runtime by the launcher (`fp8_encoder`).
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum Fp8Encoder {
    /// `encode_fp8`: integer arithmetic on the bit pattern, any runtime.
    Integer,
    /// The GPU's saturating conversion instruction (CUDA, sm_89+: `cvt.rn.satfinite.e4m3x2.f32`),
    /// reached through CubeCL's `e4m3` / `e5m2` casts, which write `__NV_SATFINITE` with the
    /// vendored code generator (`vendor/README.md`). One instruction per element where the
    /// integer encoder takes a dozen, which bound the quantize kernels; same codes (round to
    /// nearest even, saturating, NaN -> 0x7F), checked bit for bit by the kernel tests.
    Instruction,
}

/// FP8 encode by the encoder the launcher chose.
#[cube]
pub fn encode_fp8_by(x: f32, #[comptime] kind: Fp8Kind, #[comptime] encoder: Fp8Encoder) -> u32 {
    if comptime![encoder == Fp8Encoder::Instruction] {
        match kind {
            Fp8Kind::E4M3 => u32::cast_from(u8::reinterpret(e4m3::cast_from(x))),
            Fp8Kind::E5M2 => u32::cast_from(u8::reinterpret(e5m2::cast_from(x))),
        }
    } else {
        encode_fp8(x, kind)
    }
}

/// Round-to-nearest-even count of target quanta in `|x|` (bits `abs`) below the target's smallest
/// normal: the significand shifted right by `shift_base - exponent` (clamped to 1..31, which only
/// matters for inputs the caller does not select).
#[cube]
fn subnormal_quanta(abs: u32, #[comptime] shift_base: u32) -> u32 {
    let exponent = abs >> 23u32;
    let significand = (abs & 0x7F_FFFFu32) | select(exponent != 0u32, 0x80_0000u32, 0u32);
    let e = select(exponent == 0u32, 1u32, exponent);
    let shift = clamp(select(e > shift_base, 31u32, shift_base - e), 1u32, 31u32);
    let quotient = significand >> shift;
    let remainder = significand & ((1u32 << shift) - 1u32);
    let half = 1u32 << (shift - 1u32);
    let round_up = remainder > half || (remainder == half && (quotient & 1u32) == 1u32);
    quotient + u32::cast_from(round_up)
}

/// E2M1 encode, equal to TE's `cast_to_fp4x2` intervals: nearest even, saturating at 6; the sign
/// code only for values `< 0` (so -0 is +0); NaN gives 0. From 1 up, the bit-pattern rounding of
/// `encode_fp8` with one mantissa bit; below 1, the two thresholds 0.25 and 0.75 (ties to even).
#[cube]
pub fn encode_e2m1(x: f32) -> u32 {
    let bits = u32::reinterpret(x);
    let abs = bits & 0x7FFF_FFFFu32;
    let a = f32::reinterpret(abs);
    let lsb = (abs >> 22u32) & 1u32;
    let normal = min(((abs + 0x1F_FFFFu32 + lsb) >> 22u32) - 252u32, 7u32);
    let small = u32::cast_from(a > 0.25f32) + u32::cast_from(a >= 0.75f32);
    let magnitude = select(abs < 0x3F80_0000u32, small, normal);
    select(
        abs > 0x7F80_0000u32,
        0u32,
        magnitude | select(x < 0.0f32, 8u32, 0u32),
    )
}

/// `encode_e2m1(x)` for an `x` that is not NaN, with no branches and mostly FMA-pipe work (the
/// NVFP4 kernels replace NaNs by +0 before encoding, which gives NaN's code 0). With `a = |x|`
/// the E2M1 magnitude under round-to-nearest-even is `min(rint(2a), rint(a) + 2, rint(a / 2) + 4,
/// 7)` (each term is the grid's rounding on one binade range and overestimates outside it), and
/// `rint(y) + k` is the low bits of `y + 1.5 * 2^23 + k`, whose unit in the last place is 1 (ties
/// go to the even integer because `1.5 * 2^23 + k` is even for k = 0, 2, 4). `2a` and `a / 2`
/// are exact, so fusing the multiply into the add changes nothing. Checked equal to
/// `encode_e2m1` for all 2^32 f32 bit patterns that are not NaN; about 8 ALU instructions an
/// element where `encode_e2m1` takes about 16.
#[cube]
pub fn encode_e2m1_not_nan(x: f32) -> u32 {
    let a = f32::abs(x);
    let t1 = u32::reinterpret(a * 2.0f32 + 12582912.0f32);
    let t2 = u32::reinterpret(a + 12582914.0f32);
    let t3 = u32::reinterpret(a * 0.5f32 + 12582916.0f32);
    let magnitude = min(min(t1, t2), min(t3, 0x4B40_0007u32)) - 0x4B40_0000u32;
    magnitude | select(x < 0.0f32, 8u32, 0u32)
}

/// FP8 decode to the exact f32 value.
#[cube]
pub fn decode_fp8(code: u32, #[comptime] kind: Fp8Kind) -> f32 {
    let sign = (code & 0x80u32) << 24u32;
    let magnitude = code & 0x7Fu32;
    let mut bits = 0x7FC0_0000u32;
    match kind {
        Fp8Kind::E4M3 => {
            let exponent = magnitude >> 3u32;
            let mantissa = magnitude & 7u32;
            if magnitude == 0x7Fu32 {
                // NaN: keep the initial quiet NaN.
            } else if exponent == 0u32 {
                // mantissa * 2^-9
                bits = sign | u32::reinterpret(f32::cast_from(mantissa) * 0.001953125f32);
            // 2^-9
            } else {
                bits = sign | ((exponent + 120u32) << 23u32) | (mantissa << 20u32);
            }
        }
        Fp8Kind::E5M2 => {
            let exponent = magnitude >> 2u32;
            let mantissa = magnitude & 3u32;
            if exponent == 31u32 {
                bits = select(mantissa == 0u32, sign | 0x7F80_0000u32, 0x7FC0_0000u32);
            } else if exponent == 0u32 {
                // mantissa * 2^-16
                bits = sign | u32::reinterpret(f32::cast_from(mantissa) * 1.5258789e-5f32);
            // 2^-16
            } else {
                bits = sign | ((exponent + 112u32) << 23u32) | (mantissa << 21u32);
            }
        }
    }
    f32::reinterpret(bits)
}

/// E2M1 decode.
#[cube]
pub fn decode_e2m1(code: u32) -> f32 {
    let magnitude = code & 7u32;
    // {0, 0.5, 1, 1.5, 2, 3, 4, 6}: (2 + m) * 2^(e - 2) for e >= 1, m * 0.5 for e == 0.
    let exponent = magnitude >> 1u32;
    let mantissa = magnitude & 1u32;
    let mut value = f32::cast_from(mantissa) * 0.5f32;
    if exponent != 0u32 {
        value = f32::cast_from(2u32 + mantissa) * f32::reinterpret((exponent + 125u32) << 23u32);
    }
    select((code & 8u32) != 0u32, -value, value)
}

/// TE's `float_to_e8m0`: round a non-negative f32 up to a power of two (biased exponent byte).
#[cube]
pub fn float_to_e8m0(v: f32) -> u32 {
    let bits = u32::reinterpret(v);
    let exponent = (bits >> 23u32) & 0xFFu32;
    let mantissa = bits & 0x7F_FFFFu32;
    let mut e = exponent;
    if exponent == 0xFFu32 {
        e = select(mantissa != 0u32, 0xFFu32, 0xFEu32); // NaN, Inf
    } else if mantissa > 0u32
        && exponent != 0xFEu32
        && !(exponent == 0u32 && mantissa <= 0x40_0000u32)
    {
        e = exponent + 1u32;
    }
    e
}

/// `2^(e - 127)`: 0 gives 2^-127, 255 gives NaN.
#[cube]
pub fn e8m0_to_f32(e: u32) -> f32 {
    let mut bits = e << 23u32;
    if e == 0u32 {
        bits = 0x0040_0000u32;
    } else if e == 255u32 {
        bits = 0x7FC0_0000u32;
    }
    f32::reinterpret(bits)
}

/// TE's `exp2f_rcp`: `2^(127 - e)` from exponent bits; 254 gives 2^-127, 255 gives NaN.
#[cube]
pub fn e8m0_reciprocal(e: u32) -> f32 {
    let mut bits = (254u32 - e) << 23u32;
    if e == 254u32 {
        bits = 0x0040_0000u32;
    } else if e == 255u32 {
        bits = 0x7FC0_0000u32;
    }
    f32::reinterpret(bits)
}

/// `x` rounded to bf16 (nearest even) and back; NaN kept.
#[cube]
pub fn round_to_bf16(x: f32) -> f32 {
    let bits = u32::reinterpret(x);
    let mut out = bits | 0x0040_0000u32; // quiet NaN
    if (bits & 0x7FFF_FFFFu32) <= 0x7F80_0000u32 {
        let lsb = (bits >> 16u32) & 1u32;
        out = (bits + 0x7FFFu32 + lsb) & 0xFFFF_0000u32;
    }
    f32::reinterpret(out & 0xFFFF_0000u32)
}

/// `x` rounded to f16 (nearest even, overflow to infinity) and back.
#[cube]
pub fn round_to_f16(x: f32) -> f32 {
    let bits = u32::reinterpret(x);
    let abs = bits & 0x7FFF_FFFFu32;
    let sign = bits & 0x8000_0000u32;
    let mut out = bits | 0x0040_0000u32; // NaN
    if abs <= 0x7F80_0000u32 {
        if abs >= 0x477F_F000u32 {
            out = sign | 0x7F80_0000u32; // >= 65520 rounds to infinity
        } else {
            // Encode with 10 mantissa bits and bias 15 (no saturation below 65520), decode back.
            let h = encode_magnitude(abs, 10u32, 15u32, 0x7C00u32);
            out = sign | u32::reinterpret(f16_bits_to_f32(h));
        }
    }
    f32::reinterpret(out)
}

/// Rounds to the input dtype (the RHT output is stored in it).
#[cube]
pub fn round_to_kind(x: f32, #[comptime] kind: ElemKind) -> f32 {
    match kind {
        ElemKind::F32 => x,
        ElemKind::F16 => round_to_f16(x),
        ElemKind::BF16 => round_to_bf16(x),
    }
}
