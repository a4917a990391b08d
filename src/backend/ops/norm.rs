//! `NormOps`: LayerNorm and RMSNorm of the rows of a matrix, forward and backward, as one pass
//! each way, which on CubeCL backends also takes the amax of the output for an FP8
//! current-scaling quantizer (saving its amax pass). The defaults are Burn tensor ops in f32
//! (`norm_forward_reference`, `norm_backward_reference`, below): NdArray runs them, and the
//! kernels are tested against them.

use burn::tensor::backend::Backend;
use burn::tensor::ops::FloatTensor;
use burn::tensor::{FloatDType, Tensor, TensorPrimitive};

use crate::backend::{float_dtype, LowpBackend, NormBackward, NormForward, NormSpec};
use crate::error::Result;

pub trait NormOps<B: LowpBackend> {
    /// LayerNorm / RMSNorm of the rows of `x [rows, cols]` with `gamma` (and `beta`) `[cols]`
    /// in x's dtype. With `want_amax`, backends that can take the amax of `y` in the same pass
    /// return it.
    fn norm_forward(
        x: FloatTensor<B>,
        gamma: FloatTensor<B>,
        beta: Option<FloatTensor<B>>,
        spec: &NormSpec,
        _want_amax: bool,
    ) -> Result<NormForward<FloatTensor<B>, B::Bytes>> {
        let r = norm_forward_reference::<B>(x, gamma, beta, spec);
        Ok(NormForward {
            y: r.y,
            mean: r.mean,
            rstd: r.rstd,
            amax: None,
        })
    }

    /// The norm's backward: dx, and f32 dγ and (LayerNorm with `beta`) dβ.
    #[allow(clippy::too_many_arguments)]
    fn norm_backward(
        dy: FloatTensor<B>,
        x: FloatTensor<B>,
        gamma: FloatTensor<B>,
        mean: FloatTensor<B>,
        rstd: FloatTensor<B>,
        spec: &NormSpec,
        beta: bool,
    ) -> Result<NormBackward<FloatTensor<B>>> {
        Ok(norm_backward_reference::<B>(dy, x, gamma, mean, rstd, spec, beta))
    }
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
