//! Amax and the FP8 scale rule shared by per-tensor current scaling and block scaling.

/// `max |x|` as TE's amax kernels take it (`fmaxf`): NaN elements are skipped, infinities count.
/// An empty slice gives 0.
pub fn amax(values: &[f32]) -> f32 {
    values.iter().fold(0.0f32, |acc, &x| fmaxf(acc, x.abs()))
}

/// C's `fmaxf`: the larger operand, ignoring a NaN one.
pub fn fmaxf(a: f32, b: f32) -> f32 {
    if b.is_nan() || b <= a {
        a
    } else {
        b
    }
}

/// Options of TE's `compute_scale_from_amax`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ScaleRule {
    /// Largest finite value of the target FP8 format.
    pub fp8_max: f32,
    /// Round the scale down to a power of two.
    pub pow2: bool,
    /// Lower bound applied to the amax first.
    pub epsilon: f32,
    /// Scale used when `fp8_max / amax` overflows: f32::MAX for per-tensor scaling, the input
    /// dtype's largest finite value for block scaling.
    pub value_for_inf: f32,
}

/// TE's `compute_scale_from_amax` (`common/recipe/recipe_common.cuh`):
/// 1. `amax = max(amax, epsilon)`;
/// 2. amax infinite, NaN or zero gives scale 1;
/// 3. `scale = fp8_max / amax`, IEEE division rounded to nearest;
/// 4. an infinite scale becomes `value_for_inf`;
/// 5. with `pow2`, the mantissa bits are cleared (rounding the scale down to a power of two).
pub fn compute_scale_from_amax(amax: f32, rule: &ScaleRule) -> f32 {
    let amax = fmaxf(amax, rule.epsilon);
    if !amax.is_finite() || amax == 0.0 {
        return 1.0;
    }
    let mut scale = rule.fp8_max / amax;
    if scale.is_infinite() {
        scale = rule.value_for_inf;
    }
    if rule.pow2 {
        scale = f32::from_bits(scale.to_bits() & 0xFF80_0000);
    }
    scale
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(pow2: bool) -> ScaleRule {
        ScaleRule {
            fp8_max: 448.0,
            pow2,
            epsilon: 0.0,
            value_for_inf: f32::MAX,
        }
    }

    #[test]
    fn scale_special_amaxes_give_one() {
        for amax in [0.0, f32::INFINITY, f32::NAN] {
            assert_eq!(compute_scale_from_amax(amax, &rule(false)), 1.0);
        }
    }

    #[test]
    fn scale_pow2_rounds_down() {
        assert_eq!(compute_scale_from_amax(3.0, &rule(false)), 448.0 / 3.0);
        assert_eq!(compute_scale_from_amax(3.0, &rule(true)), 128.0);
        assert_eq!(compute_scale_from_amax(1e-45, &rule(false)), f32::MAX);
    }

    #[test]
    fn amax_skips_nan() {
        assert_eq!(amax(&[1.0, f32::NAN, -3.0]), 3.0);
        assert_eq!(amax(&[1.0, f32::NEG_INFINITY]), f32::INFINITY);
    }
}
