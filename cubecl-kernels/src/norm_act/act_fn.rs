//! The elementwise functions of LayerNormMLP's activations (TE's 12, spec section 10), in f32:
//! `act(x)` and its derivative for each `ActFn`, and the gate factor of the gated ones with its
//! derivative. The activation kernels and the FP8 cast's activation prologue both apply them.

use cubecl::prelude::*;

/// The elementwise function of an activation (gated ones apply it to the first half).
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum ActFn {
    /// `x · (0.5 + 0.5 · tanh(x · (0.79788456 + 0.03567741 · x²)))` (gelu, geglu), computed as
    /// `x · σ(2 · x · (0.79788456 + 0.03567741 · x²))`.
    Gelu,
    /// `x · σ(alpha · x)`, alpha = 1.702 (qgelu, qgeglu).
    Qgelu,
    /// `x · σ(x)` (silu, swiglu).
    Silu,
    /// `max(x, 0)` (relu, reglu).
    Relu,
    /// `(x > 0) · x²` (srelu, sreglu).
    Srelu,
    /// `σ(x)` (glu).
    Sigmoid,
    /// `min(x, limit) · σ(alpha · min(x, limit))` (clamped_swiglu's first half).
    ClampedSilu,
}

/// Runtime parameters: `alpha` (qgelu, clamped_swiglu), `limit` and `offset` (clamped_swiglu).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ActivationParams {
    pub alpha: f32,
    pub limit: f32,
    pub offset: f32,
}

/// `e^x` by the GPU's exponential unit where the runtime has one (CUDA: `__expf`, `ex2.approx` of
/// `x · log2 e`, within `2 + 1.2 |x|` ulp), the library `exp` elsewhere. The library `expf`
/// and `tanhf` and IEEE division made the activation kernels issue-bound (about 20 instructions
/// an element in `tanhf` alone); with these two the logistic is four instructions.
#[cube(fast_math = FastMath::ReducedPrecision | FastMath::NotNaN | FastMath::NotInf)]
fn unit_exp(x: f32) -> f32 {
    f32::exp(x)
}

/// `a / b` by the reciprocal unit where the runtime has one (CUDA: `__fdividef`, within 2 ulp;
/// 0 for an infinite `b`, which is the limit the logistic below wants).
#[cube(fast_math = FastMath::AllowReciprocal | FastMath::ReducedPrecision | FastMath::UnsignedZero | FastMath::NotInf)]
fn unit_div(a: f32, b: f32) -> f32 {
    a / b
}

/// The logistic `1 / (1 + e^-x)`, within a few ulp of f32 for every x (relative error of the
/// exponential passes through scaled by `e^-x / (1 + e^-x) < 1`).
#[cube]
fn sigmoid(x: f32) -> f32 {
    unit_div(1.0f32, 1.0f32 + unit_exp(-x))
}

/// TE's tanh-form gelu as a logistic: `0.5 + 0.5 · tanh(u) = σ(2u)` with
/// `u = x · (0.79788456 + 0.03567741 · x²)`, the same function without `tanhf`; this is `σ(2u)`.
#[cube]
fn gelu_gate(x: f32) -> f32 {
    sigmoid(x * (1.59576912f32 + 0.07135482f32 * x * x))
}

/// `act(x)`.
#[cube]
pub fn act_value(x: f32, alpha: f32, limit: f32, #[comptime] act: ActFn) -> f32 {
    match act {
        ActFn::Gelu => x * gelu_gate(x),
        ActFn::Qgelu => x * sigmoid(alpha * x),
        ActFn::Silu => x * sigmoid(x),
        ActFn::Relu => select(x > 0.0f32, x, 0.0f32),
        ActFn::Srelu => select(x > 0.0f32, x * x, 0.0f32),
        ActFn::Sigmoid => sigmoid(x),
        ActFn::ClampedSilu => {
            let c = select(x < limit, x, limit);
            c * sigmoid(alpha * c)
        }
    }
}

/// `act'(x)` (TE's `d*` functions in `common/util/math.h`). Gelu's
/// `0.5 x (1 - t²)(0.79788456 + 0.1070322243 x²) + 0.5 (1 + t)` with `t = tanh(u) = 2s - 1`,
/// `s = σ(2u)`, is `s + 2 x s (1 - s) (0.79788456 + 0.1070322243 x²)`.
#[cube]
pub fn act_derivative(x: f32, alpha: f32, limit: f32, #[comptime] act: ActFn) -> f32 {
    match act {
        ActFn::Gelu => {
            let s = gelu_gate(x);
            let slope = 0.79788456f32 + 0.1070322243f32 * x * x;
            s + 2.0f32 * x * s * (1.0f32 - s) * slope
        }
        ActFn::Qgelu => {
            let s = sigmoid(alpha * x);
            alpha * x * s * (1.0f32 - s) + s
        }
        ActFn::Silu => {
            let s = sigmoid(x);
            x * s * (1.0f32 - s) + s
        }
        ActFn::Relu => select(x > 0.0f32, 1.0f32, 0.0f32),
        ActFn::Srelu => select(x > 0.0f32, 2.0f32 * x, 0.0f32),
        ActFn::Sigmoid => {
            let s = sigmoid(x);
            s * (1.0f32 - s)
        }
        ActFn::ClampedSilu => {
            let s = sigmoid(alpha * x);
            select(x <= limit, alpha * x * s * (1.0f32 - s) + s, 0.0f32)
        }
    }
}

/// The gate factor of a gated activation.
#[cube]
pub fn gate_value(g: f32, limit: f32, offset: f32, #[comptime] clamped: bool) -> f32 {
    if comptime![clamped] {
        let low = select(g > -limit, g, -limit);
        select(low < limit, low, limit) + offset
    } else {
        g
    }
}

/// `d gate / d g`.
#[cube]
pub(crate) fn gate_derivative(g: f32, limit: f32, #[comptime] clamped: bool) -> f32 {
    let mut d = 1.0f32;
    if comptime![clamped] {
        d = select(g >= -limit && g <= limit, 1.0f32, 0.0f32);
    }
    d
}
