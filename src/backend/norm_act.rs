//! The elementwise passes of `LayerNormMLP` as backend operations: normalization forward and
//! backward, activation forward and backward. `LowpBackend` gives them default bodies written with
//! Burn tensor ops (below; NdArray uses them); `CubeBackend` runs the CubeCL kernels of
//! `burn_lowp_kernels::{norm, activation}`, which also take the amax of their output for an FP8
//! current-scaling quantizer (saving its amax pass) and the bias gradient in the same pass.

use burn::tensor::backend::Backend;
use burn::tensor::ops::FloatTensor;
use burn::tensor::{FloatDType, Tensor, TensorPrimitive};

use burn_lowp_kernels::activation::ActFn;

use super::float_dtype;
use crate::backend::activation::ActivationSpec;

/// How to normalize: LayerNorm or RMSNorm, ε, and whether γ is stored as γ - 1.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct NormSpec {
    pub rms: bool,
    pub eps: f64,
    pub zero_centered_gamma: bool,
}

/// The norm forward's results: `y` in x's dtype, per-row f32 `mean` (0 for RMSNorm) and `rstd`,
/// and the amax of `y` (f32 bits on the device) when asked for and the backend fuses it.
pub struct NormForward<T, A> {
    pub y: T,
    pub mean: T,
    pub rstd: T,
    pub amax: Option<A>,
}

/// The norm backward's results: dx in dy's dtype, f32 dγ and dβ (`[cols]`).
pub struct NormBackward<T> {
    pub dx: T,
    pub dgamma: T,
    pub dbeta: Option<T>,
}

/// The activation's results: the output (or dh), its amax when fused, and (backward) the f32
/// bias gradient `Σ_rows dh`.
pub struct ActivationOutput<T, A> {
    pub y: T,
    pub amax: Option<A>,
    pub dbias: Option<T>,
}

fn tensor<B: Backend, const D: usize>(t: FloatTensor<B>) -> Tensor<B, D> {
    Tensor::from_primitive(TensorPrimitive::Float(t))
}

/// `γ` as applied: `γ + 1` when stored zero-centered, in f32.
fn applied_gamma<B: Backend>(gamma: FloatTensor<B>, spec: &NormSpec) -> Tensor<B, 2> {
    let g = tensor::<B, 1>(gamma).cast(FloatDType::F32);
    let g = if spec.zero_centered_gamma { g + 1.0 } else { g };
    g.unsqueeze::<2>()
}

/// Norm forward with Burn ops, in f32 (the reference the kernels are tested against).
pub fn norm_forward_reference<B: Backend>(
    x: FloatTensor<B>,
    gamma: FloatTensor<B>,
    beta: Option<FloatTensor<B>>,
    spec: &NormSpec,
) -> NormForward<FloatTensor<B>, ()> {
    let x = tensor::<B, 2>(x);
    let dtype = float_dtype(x.dtype());
    let x = x.cast(FloatDType::F32);
    let [rows, _] = x.dims();
    let mean = if spec.rms {
        Tensor::zeros([rows, 1], &x.device())
    } else {
        x.clone().mean_dim(1)
    };
    let centered = x - mean.clone();
    let var = centered.clone().powi_scalar(2).mean_dim(1);
    let rstd = (var + spec.eps).sqrt().recip();
    let mut y = centered * rstd.clone() * applied_gamma::<B>(gamma, spec);
    if let (Some(beta), false) = (beta, spec.rms) {
        y = y + tensor::<B, 1>(beta).cast(FloatDType::F32).unsqueeze::<2>();
    }
    NormForward {
        y: y.cast(dtype).into_primitive().tensor(),
        mean: mean.reshape([rows]).into_primitive().tensor(),
        rstd: rstd.reshape([rows]).into_primitive().tensor(),
        amax: None,
    }
}

/// Norm backward with Burn ops, in f32.
pub fn norm_backward_reference<B: Backend>(
    dy: FloatTensor<B>,
    x: FloatTensor<B>,
    gamma: FloatTensor<B>,
    mean: FloatTensor<B>,
    rstd: FloatTensor<B>,
    spec: &NormSpec,
    beta: bool,
) -> NormBackward<FloatTensor<B>> {
    let dy = tensor::<B, 2>(dy);
    let dtype = float_dtype(dy.dtype());
    let dy = dy.cast(FloatDType::F32);
    let x = tensor::<B, 2>(x).cast(FloatDType::F32);
    let [rows, cols] = x.dims();
    let mean = tensor::<B, 1>(mean).reshape([rows, 1]);
    let rstd = tensor::<B, 1>(rstd).reshape([rows, 1]);
    let xhat = (x - mean) * rstd.clone();
    let g = dy.clone() * applied_gamma::<B>(gamma, spec);
    let c1 = (g.clone() * xhat.clone()).sum_dim(1) / cols as f64;
    let mut dx = g.clone() - xhat.clone() * c1;
    if !spec.rms {
        dx = dx - g.sum_dim(1) / cols as f64;
    }
    let dx = dx * rstd;
    NormBackward {
        dx: dx.cast(dtype).into_primitive().tensor(),
        dgamma: (dy.clone() * xhat).sum_dim(0).reshape([cols]).into_primitive().tensor(),
        dbeta: (beta && !spec.rms).then(|| dy.sum_dim(0).reshape([cols]).into_primitive().tensor()),
    }
}

fn sigmoid<B: Backend>(x: Tensor<B, 2>) -> Tensor<B, 2> {
    (x.neg().exp() + 1.0).recip()
}

fn positive<B: Backend>(x: &Tensor<B, 2>) -> Tensor<B, 2> {
    x.clone().greater_elem(0.0).float()
}

/// `act(x)` with Burn ops, in f32 (formulas as `burn_lowp_kernels::activation::act_value`).
fn act_value<B: Backend>(x: Tensor<B, 2>, f: ActFn, alpha: f32, limit: f32) -> Tensor<B, 2> {
    match f {
        ActFn::Gelu => {
            let inner = x.clone() * (x.clone().powi_scalar(2) * 0.03567741 + 0.79788456);
            x * (inner.tanh() * 0.5 + 0.5)
        }
        ActFn::Qgelu => x.clone() * sigmoid(x * alpha),
        ActFn::Silu => x.clone() * sigmoid(x),
        ActFn::Relu => x.clamp_min(0.0),
        ActFn::Srelu => positive(&x) * x.powi_scalar(2),
        ActFn::Sigmoid => sigmoid(x),
        ActFn::ClampedSilu => {
            let c = x.clamp_max(limit);
            c.clone() * sigmoid(c * alpha)
        }
    }
}

/// `act'(x)` with Burn ops, in f32.
fn act_derivative<B: Backend>(x: Tensor<B, 2>, f: ActFn, alpha: f32, limit: f32) -> Tensor<B, 2> {
    match f {
        ActFn::Gelu => {
            let t = (x.clone() * (x.clone().powi_scalar(2) * 0.044715 + 1.0) * 0.79788456).tanh();
            let sech2 = t.clone().powi_scalar(2).neg() + 1.0;
            x.clone() * 0.5 * sech2 * (x.powi_scalar(2) * 0.1070322243 + 0.79788456) + (t + 1.0) * 0.5
        }
        ActFn::Qgelu => {
            let s = sigmoid(x.clone() * alpha);
            x * alpha * s.clone() * (s.clone().neg() + 1.0) + s
        }
        ActFn::Silu => {
            let s = sigmoid(x.clone());
            x * s.clone() * (s.clone().neg() + 1.0) + s
        }
        ActFn::Relu => positive(&x),
        ActFn::Srelu => positive(&x) * x * 2.0,
        ActFn::Sigmoid => {
            let s = sigmoid(x);
            s.clone() * (s.neg() + 1.0)
        }
        ActFn::ClampedSilu => {
            let below = x.clone().lower_equal_elem(limit).float();
            let s = sigmoid(x.clone() * alpha);
            below * (x * alpha * s.clone() * (s.clone().neg() + 1.0) + s)
        }
    }
}

/// The two halves of a gated input, or the input and no gate.
fn halves<B: Backend>(h: Tensor<B, 2>, gated: bool) -> (Tensor<B, 2>, Option<Tensor<B, 2>>) {
    if !gated {
        return (h, None);
    }
    let [rows, cols] = h.dims();
    let f = cols / 2;
    (
        h.clone().slice([0..rows, 0..f]),
        Some(h.slice([0..rows, f..cols])),
    )
}

fn gate<B: Backend>(g: Tensor<B, 2>, spec: &ActivationSpec) -> (Tensor<B, 2>, Tensor<B, 2>) {
    let p = spec.kernel_params();
    if spec.activation == crate::backend::activation::Activation::ClampedSwiglu {
        let inside = g.clone().greater_equal_elem(-p.limit).float()
            * g.clone().lower_equal_elem(p.limit).float();
        (g.clamp(-p.limit, p.limit) + p.offset, inside)
    } else {
        let ones = g.ones_like();
        (g, ones)
    }
}

/// Activation forward with Burn ops, in f32.
pub fn activation_forward_reference<B: Backend>(
    h: FloatTensor<B>,
    spec: &ActivationSpec,
) -> FloatTensor<B> {
    let h = tensor::<B, 2>(h);
    let dtype = float_dtype(h.dtype());
    let p = spec.kernel_params();
    let (x, g) = halves(h.cast(FloatDType::F32), spec.activation.is_gated());
    let mut y = act_value(x, spec.activation.function(), p.alpha, p.limit);
    if let Some(g) = g {
        y = y * gate(g, spec).0;
    }
    y.cast(dtype).into_primitive().tensor()
}

/// Activation backward with Burn ops, in f32: dh and, when asked, `Σ_rows dh` (f32).
pub fn activation_backward_reference<B: Backend>(
    dy: FloatTensor<B>,
    h: FloatTensor<B>,
    spec: &ActivationSpec,
    dbias: bool,
) -> ActivationOutput<FloatTensor<B>, ()> {
    let dy = tensor::<B, 2>(dy);
    let dtype = float_dtype(dy.dtype());
    let dy = dy.cast(FloatDType::F32);
    let p = spec.kernel_params();
    let f = spec.activation.function();
    let (x, g) = halves(tensor::<B, 2>(h).cast(FloatDType::F32), spec.activation.is_gated());
    let dh = match g {
        None => dy * act_derivative(x, f, p.alpha, p.limit),
        Some(g) => {
            let (gate_value, gate_derivative) = gate(g, spec);
            let dx = dy.clone() * gate_value * act_derivative(x.clone(), f, p.alpha, p.limit);
            let dg = dy * act_value(x, f, p.alpha, p.limit) * gate_derivative;
            Tensor::cat(vec![dx, dg], 1)
        }
    };
    let dh = dh.cast(dtype);
    let cols = dh.dims()[1];
    let dbias = dbias.then(|| {
        dh.clone()
            .cast(FloatDType::F32)
            .sum_dim(0)
            .reshape([cols])
            .into_primitive()
            .tensor()
    });
    ActivationOutput {
        y: dh.into_primitive().tensor(),
        amax: None,
        dbias,
    }
}
