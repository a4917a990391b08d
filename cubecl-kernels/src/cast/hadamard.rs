//! The 16-point random Hadamard transform for NVFP4 columnwise copies, in-kernel twin of
//! `burn_lowp::format::hadamard`: sign flips by TE's mask, a 4-stage f32 butterfly, x0.25, rounded
//! to the input dtype, in exactly the reference's order.

use crate::cast::codec::round_to_kind;
use crate::util::elements::ElemKind;

use cubecl::prelude::*;

/// TE's sign vector as a bit mask (bit i set where s_i = -1).
pub const RHT_SIGN_MASK: u32 = 0xD7E8;

/// Transforms `v[offset + i * stride]` for i in 0..16, in place.
#[cube]
pub fn rht16(
    v: &mut Array<f32>,
    offset: usize,
    #[comptime] stride: usize,
    #[comptime] kind: ElemKind,
) {
    #[unroll]
    for i in 0..16usize {
        if comptime![(RHT_SIGN_MASK >> i) & 1 == 1] {
            v[offset + i * stride] = -v[offset + i * stride];
        }
    }
    #[unroll]
    for stage in 0..4u32 {
        let h = comptime![1usize << stage];
        #[unroll]
        for i in 0..16usize {
            if comptime![i & h == 0] {
                let a = v[offset + i * stride];
                let b = v[offset + (i + h) * stride];
                v[offset + i * stride] = a + b;
                v[offset + (i + h) * stride] = a - b;
            }
        }
    }
    #[unroll]
    for i in 0..16usize {
        v[offset + i * stride] = round_to_kind(v[offset + i * stride] * 0.25f32, kind);
    }
}

/// The inverse transform (`H16 / 4` then the sign flips), in f32, in place.
#[cube]
pub fn inverse_rht16(v: &mut Array<f32>) {
    #[unroll]
    for stage in 0..4u32 {
        let h = comptime![1usize << stage];
        #[unroll]
        for i in 0..16usize {
            if comptime![i & h == 0] {
                let a = v[i];
                let b = v[i + h];
                v[i] = a + b;
                v[i + h] = a - b;
            }
        }
    }
    #[unroll]
    for i in 0..16usize {
        let x = v[i] * 0.25f32;
        if comptime![(RHT_SIGN_MASK >> i) & 1 == 1] {
            v[i] = -x;
        } else {
            v[i] = x;
        }
    }
}
