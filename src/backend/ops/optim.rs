//! `OptimOps`: one AdamW step of one parameter with Burn's gradient-norm clipping, the step of
//! `optim::FusedAdamW`. The default is Burn's sequence of tensor ops (`adamw_step_reference`,
//! below), which NdArray runs and the CubeCL kernel (one launch, plus the sum of squares when
//! clipping) is tested against.

use burn::tensor::backend::Backend;
use burn::tensor::ops::FloatTensor;
use burn::tensor::{DType, FloatDType, Tensor, TensorMetadata, TensorPrimitive};

use crate::backend::optim::{AdamWStep, AdamWTensors};
use crate::backend::{float_dtype, LowpBackend};

pub trait OptimOps<B: LowpBackend> {
    /// One AdamW step of a parameter with Burn's gradient-norm clipping (`optim::FusedAdamW`):
    /// the parameter in its dtype and the f32 moments, all flat `[n]`. The default runs Burn's
    /// sequence of tensor ops (`adamw_step_reference`); CubeCL backends run one kernel (plus the
    /// sum of squares when clipping).
    fn optim_adamw_step(
        param: FloatTensor<B>,
        grad: FloatTensor<B>,
        moments: Option<(FloatTensor<B>, FloatTensor<B>)>,
        step: &AdamWStep,
    ) -> AdamWTensors<FloatTensor<B>> {
        adamw_step_reference::<B>(param, grad, moments, step)
    }
}

/// The smallest positive normal of the gradient's dtype (Burn's clipping adds it to the norm).
pub fn min_positive(dtype: DType) -> f32 {
    match dtype {
        DType::F16 => half::f16::MIN_POSITIVE.to_f32(),
        DType::BF16 => half::bf16::MIN_POSITIVE.to_f32(),
        _ => f32::MIN_POSITIVE,
    }
}

fn flat<B: Backend>(t: FloatTensor<B>) -> Tensor<B, 1> {
    let n = t.shape().num_elements();
    Tensor::<B, 1>::from_primitive(TensorPrimitive::Float(t)).reshape([n])
}

/// `Σ x²` of an f32 tensor as Burn's norm clipping forms it (`square().sum()`), `[1]`.
pub fn sum_of_squares<B: Backend>(x: FloatTensor<B>) -> FloatTensor<B> {
    B::float_sum(B::float_powi_scalar(x, 2.into()))
}

/// Burn's clipping and AdamW step in Burn tensor ops on f32 copies of `param` and `grad`, the
/// parameter cast back once: the default `optim_adamw_step` and the kernel's reference.
/// `moments`: the previous f32 `(m, v)`, `None` on the first step.
pub fn adamw_step_reference<B: Backend>(
    param: FloatTensor<B>,
    grad: FloatTensor<B>,
    moments: Option<(FloatTensor<B>, FloatTensor<B>)>,
    step: &AdamWStep,
) -> AdamWTensors<FloatTensor<B>> {
    let param_dtype = float_dtype(param.dtype());
    let grad_dtype = grad.dtype();
    let w = flat::<B>(param).cast(FloatDType::F32);
    let g = B::float_cast(grad, FloatDType::F32);
    // Σ g² over the gradient's own shape (a backend's sum may order its terms by shape).
    let sum_squares = step
        .grad_clip_norm
        .map(|_| sum_of_squares::<B>(g.clone()));
    let mut g = flat::<B>(g);
    if let (Some(threshold), Some(sum_squares)) = (step.grad_clip_norm, sum_squares) {
        // GradientClipping::clip_by_norm: threshold / (‖g‖ + min_positive), at most 1.
        let norm = Tensor::<B, 1>::from_primitive(TensorPrimitive::Float(sum_squares)).sqrt();
        let coef = (threshold / norm.add_scalar(min_positive(grad_dtype))).clamp_max(1.0);
        g = g * coef;
    }
    let (f1, f2) = (1.0 - step.beta_1, 1.0 - step.beta_2);
    let (m, v) = match moments {
        None => (g.clone().mul_scalar(f1), g.square().mul_scalar(f2)),
        Some((m, v)) => (
            flat::<B>(m).mul_scalar(step.beta_1).add(g.clone().mul_scalar(f1)),
            flat::<B>(v).mul_scalar(step.beta_2).add(g.square().mul_scalar(f2)),
        ),
    };
    let (c1, c2) = step.corrections();
    let delta = m.clone().div_scalar(c1).div(v.clone().div_scalar(c2).sqrt().add_scalar(step.epsilon));
    let decay_rate = step.lr * step.weight_decay as f64;
    let decayed = if decay_rate == 0.0 { w } else { w.mul_scalar(1.0 - decay_rate) };
    let w = decayed - delta.mul_scalar(step.lr);
    AdamWTensors {
        param: w.cast(param_dtype).into_primitive().tensor(),
        moment_1: m.into_primitive().tensor(),
        moment_2: v.into_primitive().tensor(),
    }
}
