//! `ActivationOps`: LayerNormMLP's activation (TE's set, `ActivationSpec`) forward and backward,
//! the activation fused into the FP8 cast of its output (delayed and current scaling), and a
//! Linear's bias gradient with dY's amax from one read. On CubeCL backends each is one pass that
//! also takes the amax of its output and the bias gradient where asked; the defaults are Burn
//! tensor ops in f32 (`activation_forward_reference`, `activation_backward_reference`, below),
//! which NdArray runs and the kernels are tested against, and no fused cast.

use burn::tensor::backend::Backend;
use burn::tensor::ops::FloatTensor;
use burn::tensor::{FloatDType, Tensor, TensorPrimitive};

use burn_lowp_kernels::activation::ActFn;

use super::rows::column_sum;
use crate::backend::activation::{Activation, ActivationOutput, ActivationSpec};
use crate::backend::{float_dtype, AmaxHistoryColumns, LowpBackend, QuantizedTensor, ScaleColumns};
use crate::error::Result;
use crate::format::{FormatConfig, Fp8Format, Usage};

pub trait ActivationOps<B: LowpBackend> {
    /// The activation of `h [rows, F']`, `[rows, F]` (`F' = 2F` when gated); its amax when
    /// `want_amax` and the backend fuses it.
    fn act_forward(
        h: FloatTensor<B>,
        spec: &ActivationSpec,
        _want_amax: bool,
    ) -> Result<ActivationOutput<FloatTensor<B>, B::Bytes>> {
        Ok(ActivationOutput {
            y: activation_forward_reference::<B>(h, spec),
            amax: None,
            dbias: None,
        })
    }

    /// The activation's backward: `dh [rows, F']` from `dy [rows, F]` and `h`; its amax when
    /// `want_amax` and fused; the f32 bias gradient `Σ_rows dh` when `want_dbias`.
    fn act_backward(
        dy: FloatTensor<B>,
        h: FloatTensor<B>,
        spec: &ActivationSpec,
        _want_amax: bool,
        want_dbias: bool,
    ) -> Result<ActivationOutput<FloatTensor<B>, B::Bytes>> {
        let r = activation_backward_reference::<B>(dy, h, spec, want_dbias);
        Ok(ActivationOutput {
            y: r.y,
            amax: None,
            dbias: r.dbias,
        })
    }

    /// A LayerNormMLP's fc2 input under FP8 delayed scaling in one pass where the backend fuses
    /// it: the activation of `h [rows, F']` quantized with the given scale as
    /// `QuantizeOps::quantize_fp8_with_scale` does (recording the amax into `record` where
    /// `quantize_delayed_amax_in_place`), in the representations of `usage`, bit for bit
    /// `act_forward` followed by `quantize_fp8_with_scale` on its output, without that output in
    /// memory. `None` where the backend has no such kernel: the caller runs the two. The default
    /// has none.
    fn act_quantize_fp8_with_scale(
        _h: FloatTensor<B>,
        _spec: &ActivationSpec,
        _fp8: Fp8Format,
        _scale: ScaleColumns<B>,
        _usage: Usage,
        _record: Option<AmaxHistoryColumns<B>>,
    ) -> Result<Option<QuantizedTensor<B>>> {
        Ok(None)
    }

    /// A LayerNormMLP's fc2 input under FP8 current scaling (`config`, a
    /// `FormatConfig::Fp8Current`) without the activation's output in memory, where the backend
    /// fuses it: an amax pass over the activation of `h`, then the cast applying the activation
    /// itself; bit for bit `act_forward` (with its amax) followed by
    /// `QuantizeOps::quantize_fp8_current_with_amax`. `None` where the backend has no such
    /// kernels: the caller runs the two. The default has none.
    fn act_quantize_fp8_current(
        _h: FloatTensor<B>,
        _spec: &ActivationSpec,
        _config: &FormatConfig,
        _usage: Usage,
    ) -> Result<Option<QuantizedTensor<B>>> {
        Ok(None)
    }

    /// A Linear's bias gradient `Σ_rows dy` of `dy [rows, cols]` (`[cols]`, in dy's dtype or
    /// f32; the caller casts it to the bias's dtype) and, where fused, `max |dy|` from the same
    /// read (f32 bits), which FP8 current scaling of dY then uses instead of its own amax pass
    /// (`OperandQuantizer::quantize_with_amax`): the backward of the identity activation with
    /// its bias gradient and amax. The default sums with Burn ops (`column_sum`) and takes no
    /// amax.
    fn act_dbias_amax(dy: FloatTensor<B>) -> Result<(FloatTensor<B>, Option<B::Bytes>)> {
        Ok((column_sum::<B>(dy), None))
    }
}

fn tensor<B: Backend, const D: usize>(t: FloatTensor<B>) -> Tensor<B, D> {
    Tensor::from_primitive(TensorPrimitive::Float(t))
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
    if spec.activation == Activation::ClampedSwiglu {
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
