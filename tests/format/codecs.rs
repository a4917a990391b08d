//! The scalar codecs against two independent references: the `float8` crate (a port of CUDA's
//! `cuda_fp8.hpp` conversions) and a brute-force nearest-value search over every code.

use burn_lowp::format::codec::{
    decode_e2m1, e8m0_reciprocal, e8m0_to_f32, encode_e2m1, float_to_e8m0, Fp8Format,
};
use float8::{F8E4M3, F8E5M2};

use crate::common::SplitMix;

/// f32 inputs that stress every rounding boundary: each FP8 value and midpoint, a few ulps either
/// side, plus a sweep of bit patterns across the whole f32 range.
fn boundary_inputs() -> Vec<f32> {
    let mut xs = Vec::new();
    for fmt in [Fp8Format::E4M3, Fp8Format::E5M2] {
        let mut finite: Vec<f32> = (0u8..=0x7F)
            .map(|c| fmt.decode(c))
            .filter(|v| v.is_finite())
            .collect();
        finite.sort_by(f32::total_cmp);
        for w in finite.windows(2) {
            for v in [w[0], (w[0] + w[1]) / 2.0] {
                for d in -3i32..=3 {
                    let b = (v.to_bits() as i32 + d).max(0) as u32;
                    xs.push(f32::from_bits(b));
                    xs.push(-f32::from_bits(b));
                }
            }
        }
    }
    for bits in (0..0x7F80_0000u32).step_by(4099) {
        xs.push(f32::from_bits(bits));
        xs.push(-f32::from_bits(bits));
    }
    xs.extend([
        0.0,
        -0.0,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::MAX,
        f32::MIN_POSITIVE,
        464.0,
        61440.0,
    ]);
    xs
}

#[test]
fn fp8_encode_matches_cuda_fp8_conversion() {
    for x in boundary_inputs() {
        assert_eq!(
            Fp8Format::E4M3.encode(x),
            F8E4M3::from_f32(x).to_bits(),
            "e4m3 of {x:e} ({:#x})",
            x.to_bits()
        );
        assert_eq!(
            Fp8Format::E5M2.encode(x),
            F8E5M2::from_f32(x).to_bits(),
            "e5m2 of {x:e} ({:#x})",
            x.to_bits()
        );
    }
}

#[test]
fn fp8_decode_matches_cuda_fp8_conversion() {
    for code in 0..=255u8 {
        let (ours, theirs) = (
            Fp8Format::E4M3.decode(code),
            F8E4M3::from_bits(code).to_f32(),
        );
        assert!(
            ours.to_bits() == theirs.to_bits() || (ours.is_nan() && theirs.is_nan()),
            "e4m3 {code:#x}"
        );
        let (ours, theirs) = (
            Fp8Format::E5M2.decode(code),
            F8E5M2::from_bits(code).to_f32(),
        );
        assert!(
            ours.to_bits() == theirs.to_bits() || (ours.is_nan() && theirs.is_nan()),
            "e5m2 {code:#x}"
        );
    }
}

/// Nearest finite value among `codes` (ties to the even code), saturating at the largest.
fn brute_force_nearest(x: f32, codes: &[(u8, f32)]) -> u8 {
    let a = x.abs() as f64;
    let mut best = codes[0];
    for &(c, v) in codes {
        let (d, bd) = ((v as f64 - a).abs(), (best.1 as f64 - a).abs());
        if d < bd || (d == bd && c % 2 == 0) {
            best = (c, v);
        }
    }
    best.0
}

#[test]
fn fp8_and_e2m1_encode_are_nearest_even() {
    let e4m3: Vec<(u8, f32)> = (0u8..0x7F)
        .map(|c| (c, Fp8Format::E4M3.decode(c)))
        .collect();
    let e5m2: Vec<(u8, f32)> = (0u8..0x7C)
        .map(|c| (c, Fp8Format::E5M2.decode(c)))
        .collect();
    let e2m1: Vec<(u8, f32)> = (0u8..8).map(|c| (c, decode_e2m1(c))).collect();
    let mut rng = SplitMix(42);
    for _ in 0..200_000 {
        let x = (rng.normal() * (40.0 * rng.uniform() - 20.0).exp2()) as f32;
        let sign = if x.is_sign_negative() { 0x80 } else { 0 };
        assert_eq!(
            Fp8Format::E4M3.encode(x),
            brute_force_nearest(x, &e4m3) | sign,
            "e4m3 {x:e}"
        );
        assert_eq!(
            Fp8Format::E5M2.encode(x),
            brute_force_nearest(x, &e5m2) | sign,
            "e5m2 {x:e}"
        );
        let small = (rng.normal() * 3.0) as f32;
        let sign = if small < 0.0 { 8 } else { 0 };
        assert_eq!(
            encode_e2m1(small),
            brute_force_nearest(small, &e2m1) | sign,
            "e2m1 {small}"
        );
    }
}

#[test]
fn e8m0_rounds_up_to_a_power_of_two() {
    let mut rng = SplitMix(7);
    for _ in 0..100_000 {
        let v = (rng.uniform() * (250.0 * rng.uniform() - 125.0).exp2()) as f32;
        if v <= f32::from_bits(0x0040_0000) {
            assert_eq!(float_to_e8m0(v), 0, "{v:e}");
            continue;
        }
        let e = float_to_e8m0(v);
        // The scale covers v, and the next smaller one does not.
        assert!(e8m0_to_f32(e) as f64 >= v as f64, "{v:e} -> {e}");
        assert!(
            (e8m0_to_f32(e - 1) as f64) < v as f64,
            "{v:e} -> {e} is not the smallest"
        );
        assert_eq!(e8m0_reciprocal(e) as f64 * e8m0_to_f32(e) as f64, 1.0);
    }
}
