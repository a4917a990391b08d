//! Per-tensor and per-block scale rules, in-kernel twins of `burn_lowp::format::scaling`,
//! `fp8_tensor` and `nvfp4`.

use crate::cast::codec::{decode_fp8, encode_fp8, Fp8Kind};

use cubecl::prelude::*;

/// Options of TE's `compute_scale_from_amax`, as comptime bit patterns.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub struct ScaleRule {
    pub fp8: Fp8Kind,
    pub pow2: bool,
    /// f32 bits of the amax lower bound.
    pub epsilon_bits: u32,
    /// f32 bits of the scale used when `fp8_max / amax` overflows.
    pub value_for_inf_bits: u32,
}

/// `compute_scale_from_amax`: max(amax, eps); 0/Inf/NaN -> 1; fp8_max / amax; Inf -> value_for_inf;
/// pow2 clears the mantissa.
#[cube]
pub fn scale_from_amax(amax: f32, #[comptime] rule: ScaleRule) -> f32 {
    let mut a = u32::reinterpret(amax) & 0x7FFF_FFFFu32;
    let epsilon = comptime![rule.epsilon_bits];
    let amax_is_nan = a > 0x7F80_0000u32;
    // fmaxf(amax, eps): a NaN amax yields eps.
    if amax_is_nan || a < epsilon {
        a = epsilon;
    }
    let mut scale = 1.0f32;
    if a != 0u32 && a < 0x7F80_0000u32 {
        scale = f32::new(comptime![f32::from_bits(rule.fp8.max_bits())]) / f32::reinterpret(a);
        if u32::reinterpret(scale) == 0x7F80_0000u32 {
            scale = f32::new(comptime![f32::from_bits(rule.value_for_inf_bits)]);
        }
        if comptime![rule.pow2] {
            scale = f32::reinterpret(u32::reinterpret(scale) & 0xFF80_0000u32);
        }
    }
    scale
}

/// NVFP4 global encode scale `S_enc = 2688 / amax`, capped at f32::MAX; 0 amax or 0 result -> 1.
#[cube]
pub fn nvfp4_global_encode_scale(amax: f32) -> f32 {
    let mut s = 1.0f32;
    if (u32::reinterpret(amax) & 0x7FFF_FFFFu32) != 0u32 {
        let q = 2688.0f32 / amax;
        let q = select(u32::reinterpret(q) >= 0x7F80_0000u32, 3.4028235e38f32, q);
        if u32::reinterpret(q) != 0u32 {
            s = q;
        }
    }
    s
}

/// NVFP4 E4M3 block scale byte: `e4m3(min(block_amax * (S_enc * (1/6)), 448))`.
#[cube]
pub fn nvfp4_block_scale(block_amax: f32, multiplier: f32) -> u32 {
    let d = block_amax * multiplier;
    let d = select(u32::reinterpret(d) > 0x43E0_0000u32, 448.0f32, d);
    encode_fp8(d, Fp8Kind::E4M3)
}

/// NVFP4 element multiplier `min(1 / (s_b * S_dec), f32::MAX)`.
#[cube]
pub fn nvfp4_element_scale(scale_byte: u32, s_dec: f32) -> f32 {
    let e = 1.0f32 / (decode_fp8(scale_byte, Fp8Kind::E4M3) * s_dec);
    select(u32::reinterpret(e) >= 0x7F80_0000u32, 3.4028235e38f32, e)
}
