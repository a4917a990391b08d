//! Scalar codecs: f32 to and from the element and scale encodings of every format.
//!
//! All encoders work on the f32 bit pattern with integer arithmetic only (no f64, no log2), so that
//! the CubeCL kernels can run the very same steps on every runtime and match bit for bit.
//!
//! * FP8 E4M3 ("e4m3fn": no infinity, max 448) and E5M2 (max 57344): round to nearest even,
//!   saturating to the largest finite value (PTX `cvt.rn.satfinite`), NaN kept (code 0x7F).
//! * E2M1 (FP4, max 6): round to nearest even on the grid {0, 0.5, 1, 1.5, 2, 3, 4, 6}, saturating.
//!   Sign and NaN follow TE's reference `cast_to_fp4x2`: a value gets the sign code only when it is
//!   `< 0` (so `-0.0` encodes as +0) and NaN encodes as +0.
//! * E8M0 (MXFP8 block scale): `float_to_e8m0`, rounding a positive f32 *up* to a power of two.

/// An 8-bit floating-point element format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Fp8Format {
    /// 4 exponent bits, 3 mantissa bits, bias 7, max 448, no infinity.
    E4M3,
    /// 5 exponent bits, 2 mantissa bits, bias 15, max 57344.
    E5M2,
}

impl Fp8Format {
    /// Largest finite magnitude.
    pub fn max(self) -> f32 {
        match self {
            Fp8Format::E4M3 => 448.0,
            Fp8Format::E5M2 => 57344.0,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Fp8Format::E4M3 => "e4m3",
            Fp8Format::E5M2 => "e5m2",
        }
    }

    fn minifloat(self) -> &'static Minifloat {
        match self {
            Fp8Format::E4M3 => &E4M3,
            Fp8Format::E5M2 => &E5M2,
        }
    }

    /// Encode with round-to-nearest-even and saturation.
    pub fn encode(self, x: f32) -> u8 {
        encode_minifloat(x, self.minifloat())
    }

    /// Decode a code to its exact f32 value.
    pub fn decode(self, code: u8) -> f32 {
        decode_minifloat(code, self.minifloat())
    }
}

/// Layout of a small binary floating-point format with subnormals.
struct Minifloat {
    mantissa_bits: u32,
    bias: i32,
    /// Code of the largest finite magnitude.
    max_code: u8,
    /// f32 bit pattern of the largest finite magnitude: anything at or above saturates.
    max_f32_bits: u32,
    /// Bit that carries the sign in a code.
    sign_bit: u8,
    /// Code written for NaN.
    nan_code: u8,
    /// Whether the all-ones exponent encodes Inf/NaN (E5M2) rather than finite values.
    ieee_specials: bool,
    /// Whether the all-ones code (minus sign) is NaN (E4M3).
    all_ones_nan: bool,
}

const E4M3: Minifloat = Minifloat {
    mantissa_bits: 3,
    bias: 7,
    max_code: 0x7E,
    max_f32_bits: 0x43E0_0000, // 448.0
    sign_bit: 0x80,
    nan_code: 0x7F,
    ieee_specials: false,
    all_ones_nan: true,
};

const E5M2: Minifloat = Minifloat {
    mantissa_bits: 2,
    bias: 15,
    max_code: 0x7B,
    max_f32_bits: 0x4760_0000, // 57344.0
    sign_bit: 0x80,
    nan_code: 0x7F,
    ieee_specials: true,
    all_ones_nan: false,
};

const E2M1: Minifloat = Minifloat {
    mantissa_bits: 1,
    bias: 1,
    max_code: 0x7,
    max_f32_bits: 0x40C0_0000, // 6.0
    sign_bit: 0x8,
    nan_code: 0x0,
    ieee_specials: false,
    all_ones_nan: false,
};

/// `v >> shift`, rounded to nearest with ties to even. Shifts past 63 give 0.
fn shift_right_rne(v: u64, shift: u32) -> u64 {
    if shift == 0 {
        return v;
    }
    if shift > 63 {
        return 0;
    }
    let quotient = v >> shift;
    let remainder = v & ((1u64 << shift) - 1);
    let half = 1u64 << (shift - 1);
    if remainder > half || (remainder == half && quotient & 1 == 1) {
        quotient + 1
    } else {
        quotient
    }
}

/// Magnitude code (no sign) of a finite, non-saturating `|x|` given as f32 bits.
fn encode_magnitude(abs_bits: u32, f: &Minifloat) -> u8 {
    let m = f.mantissa_bits;
    let emin = 1 - f.bias; // exponent of the smallest normal
    let exp = (abs_bits >> 23) as i32;
    let magnitude = if exp - 127 < emin {
        // Target subnormal (or zero): count quanta of 2^(emin - m). The f32 value is
        // sig * 2^(e - 23), so the count is sig >> (emin - m + 23 - e). A count of 2^m is the
        // smallest normal, whose code is exactly 2^m too.
        let significand = (abs_bits & 0x7F_FFFF) | if exp != 0 { 0x80_0000 } else { 0 };
        let unbiased = exp.max(1) - 127;
        let shift = (emin - m as i32 + 23 - unbiased) as u32;
        shift_right_rne(significand as u64, shift)
    } else {
        // Normal: keep m mantissa bits; a carry out of the mantissa bumps the exponent, as it
        // should. Then move the exponent from f32's bias to the target's.
        shift_right_rne(abs_bits as u64, 23 - m) - (((127 - f.bias) as u64) << m)
    };
    magnitude.min(f.max_code as u64) as u8
}

fn encode_minifloat(x: f32, f: &Minifloat) -> u8 {
    let bits = x.to_bits();
    let abs_bits = bits & 0x7FFF_FFFF;
    let sign = if bits >> 31 == 1 { f.sign_bit } else { 0 };
    if abs_bits > 0x7F80_0000 {
        return f.nan_code;
    }
    if abs_bits >= f.max_f32_bits {
        return f.max_code | sign; // saturate, infinity included
    }
    encode_magnitude(abs_bits, f) | sign
}

fn decode_minifloat(code: u8, f: &Minifloat) -> f32 {
    let m = f.mantissa_bits;
    let magnitude = (code & !f.sign_bit) as u32;
    let negative = code & f.sign_bit != 0;
    let exp_field = magnitude >> m;
    let mantissa = magnitude & ((1 << m) - 1);
    let max_exp_field = (f.sign_bit as u32 - 1) >> m;
    if f.all_ones_nan && magnitude == (f.sign_bit as u32 - 1) {
        return f32::NAN;
    }
    if f.ieee_specials && exp_field == max_exp_field {
        return if mantissa != 0 {
            f32::NAN
        } else if negative {
            f32::NEG_INFINITY
        } else {
            f32::INFINITY
        };
    }
    // value = mantissa * 2^(emin - m) for subnormals, (2^m + mantissa) * 2^(e - bias - m) else;
    // both products are exact in f32.
    let value = if exp_field == 0 {
        mantissa as f32 * pow2(1 - f.bias - m as i32)
    } else {
        ((1 << m) + mantissa) as f32 * pow2(exp_field as i32 - f.bias - m as i32)
    };
    if negative {
        -value
    } else {
        value
    }
}

/// Exact 2^e for e in the f32 normal range.
fn pow2(e: i32) -> f32 {
    debug_assert!((-126..=127).contains(&e));
    f32::from_bits(((e + 127) as u32) << 23)
}

/// Encode to E2M1 (FP4). See the module docs for sign and NaN handling.
pub fn encode_e2m1(x: f32) -> u8 {
    if x.is_nan() {
        return E2M1.nan_code;
    }
    let abs_bits = x.to_bits() & 0x7FFF_FFFF;
    let magnitude = if abs_bits >= E2M1.max_f32_bits {
        E2M1.max_code
    } else {
        encode_magnitude(abs_bits, &E2M1)
    };
    if x < 0.0 {
        magnitude | E2M1.sign_bit
    } else {
        magnitude
    }
}

/// The 16 E2M1 code values; code 8 is -0.
pub const E2M1_VALUES: [f32; 16] = [
    0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0,
];

pub fn decode_e2m1(code: u8) -> f32 {
    E2M1_VALUES[(code & 0xF) as usize]
}

/// TE's `float_to_e8m0`: round a non-negative f32 up to a power of two, as a biased exponent byte.
///
/// NaN gives 0xFF, infinity 0xFE (saturated), zero 0x00. Otherwise the f32 exponent field, plus one
/// when the mantissa is non-zero, except at 0xFE (saturate) and for subnormals `<= 2^-127`, which
/// stay 0x00.
pub fn float_to_e8m0(v: f32) -> u8 {
    let bits = v.to_bits();
    if v.is_nan() {
        return 0xFF;
    }
    if v.is_infinite() {
        return 0xFE;
    }
    let exponent = (bits >> 23) & 0xFF;
    let mantissa = bits & 0x7F_FFFF;
    let round_up = mantissa > 0 && exponent != 0xFE && !(exponent == 0 && mantissa <= 0x40_0000);
    (exponent + round_up as u32) as u8
}

/// The value of an E8M0 scale, `2^(e - 127)`; 0 gives 2^-127 (an f32 subnormal), 255 gives NaN.
pub fn e8m0_to_f32(e: u8) -> f32 {
    match e {
        0 => f32::from_bits(0x0040_0000),
        255 => f32::NAN,
        _ => f32::from_bits((e as u32) << 23),
    }
}

/// TE's `exp2f_rcp`: the element multiplier `2^(127 - e)` built from exponent bits.
/// 254 gives 2^-127 (subnormal), 255 gives NaN, 0 (an all-zero block) gives 2^127.
pub fn e8m0_reciprocal(e: u8) -> f32 {
    match e {
        254 => f32::from_bits(0x0040_0000),
        255 => f32::NAN,
        _ => f32::from_bits((254 - e as u32) << 23),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn e4m3_known_values() {
        let f = Fp8Format::E4M3;
        assert_eq!(f.encode(448.0), 0x7E);
        assert_eq!(f.encode(1000.0), 0x7E);
        assert_eq!(f.encode(f32::INFINITY), 0x7E);
        assert_eq!(f.encode(-f32::INFINITY), 0xFE);
        assert_eq!(f.encode(f32::NAN), 0x7F);
        assert_eq!(f.encode(1.0), 0x38);
        assert_eq!(f.encode(-2.0), 0xC0);
        assert_eq!(f.encode(2f32.powi(-9)), 0x01); // smallest subnormal
        assert_eq!(f.encode(2f32.powi(-10)), 0x00); // tie to even: 0
        assert_eq!(f.encode(3.0 * 2f32.powi(-10)), 0x02); // tie 1.5 quanta -> 2
        assert_eq!(f.decode(0x7E), 448.0);
        assert_eq!(f.decode(0x01), 2f32.powi(-9));
        assert!(f.decode(0xFF).is_nan());
    }

    #[test]
    fn e5m2_known_values() {
        let f = Fp8Format::E5M2;
        assert_eq!(f.encode(57344.0), 0x7B);
        assert_eq!(f.encode(1e9), 0x7B);
        assert_eq!(f.encode(1.0), 0x3C);
        assert_eq!(f.encode(2f32.powi(-16)), 0x01);
        assert_eq!(f.decode(0x7C), f32::INFINITY);
        assert!(f.decode(0x7F).is_nan());
    }

    #[test]
    fn e2m1_matches_reference_thresholds() {
        // TE reference_nvfp4.py::cast_to_fp4x2 intervals, checked at and around each boundary.
        let cases = [
            (0.0, 0),
            (0.25, 0),
            (0.2501, 1),
            (0.7499, 1),
            (0.75, 2),
            (1.25, 2),
            (1.2501, 3),
            (1.75, 4),
            (2.5, 4),
            (2.5001, 5),
            (3.4999, 5),
            (3.5, 6),
            (5.0, 6),
            (5.0001, 7),
            (100.0, 7),
            (-0.0, 0),
            (-0.1, 8),
            (-0.25, 8),
            (-0.3, 9),
            (-0.75, 10),
            (-5.0, 14),
            (-5.1, 15),
        ];
        for (x, code) in cases {
            assert_eq!(encode_e2m1(x), code, "x = {x}");
        }
        assert_eq!(encode_e2m1(f32::NAN), 0);
    }

    #[test]
    fn e8m0_special_cases() {
        assert_eq!(float_to_e8m0(f32::NAN), 0xFF);
        assert_eq!(float_to_e8m0(f32::INFINITY), 0xFE);
        assert_eq!(float_to_e8m0(0.0), 0x00);
        assert_eq!(float_to_e8m0(1.0), 127);
        assert_eq!(float_to_e8m0(1.5), 128);
        assert_eq!(float_to_e8m0(f32::MAX), 0xFE);
        assert_eq!(float_to_e8m0(f32::from_bits(0x0040_0000)), 0);
        assert_eq!(float_to_e8m0(f32::from_bits(0x0040_0001)), 1);
        assert_eq!(e8m0_to_f32(127), 1.0);
        assert_eq!(e8m0_reciprocal(0), 2f32.powi(127));
        assert_eq!(e8m0_reciprocal(254), f32::from_bits(0x0040_0000));
        assert!(e8m0_reciprocal(255).is_nan());
    }
}
