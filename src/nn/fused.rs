//! Fused, differentiable stand-ins for elementwise blocks a Burn model builds from tensor ops:
//! one kernel forward and one backward each on CubeCL backends (`ops/norm_op.rs`,
//! `ops/activation_op.rs`), the same Burn-op arithmetic in f32 elsewhere. Every kernel launch
//! costs host time, and a small model's training step is bound by it (README, "What bounds the
//! step"), so these keep Burn's modules and parameters and only replace how they run:
//!
//! ```text
//! let h = burn_lowp::nn::fused::rms_norm(&self.norm, x)?; // instead of self.norm.forward(x)
//! let a = burn_lowp::nn::fused::swiglu(h)?; // silu(h[:, :F]) * h[:, F:]
//! ```

use burn::nn::{RmsNorm, RotaryEncoding};
use burn::tensor::{Tensor, TensorPrimitive};

use crate::backend::norm_act::NormSpec;
use crate::error::Result;
use crate::ops::{Activation, ActivationParams, ActivationSpec, LowpLinear, RopePositions};

/// `norm.forward(x)` for Burn's `RmsNorm` on `x [rows, d_model]`: `x / rms(x) · γ`, the mean of
/// squares and the product with γ in f32, rounded once to x's dtype (Burn's op rounds `rms` to
/// x's dtype before dividing, so BF16 results can differ from it in the last bit).
pub fn rms_norm<B: LowpLinear>(norm: &RmsNorm<B>, x: Tensor<B, 2>) -> Result<Tensor<B, 2>> {
    let spec = NormSpec {
        rms: true,
        eps: norm.epsilon,
        zero_centered_gamma: false,
    };
    let y = B::lowp_norm_rows(
        x.into_primitive().tensor(),
        norm.gamma.val().into_primitive().tensor(),
        &spec,
    )?;
    Ok(Tensor::from_primitive(TensorPrimitive::Float(y)))
}

/// An activation of TE's set on `h [rows, cols]` (gated ones write `[rows, cols / 2]`).
pub fn activation<B: LowpLinear>(h: Tensor<B, 2>, spec: &ActivationSpec) -> Result<Tensor<B, 2>> {
    let y = B::lowp_activation_rows(h.into_primitive().tensor(), spec)?;
    Ok(Tensor::from_primitive(TensorPrimitive::Float(y)))
}

/// SwiGLU: `silu(h[:, :F]) · h[:, F:]` for `h [rows, 2F]`.
pub fn swiglu<B: LowpLinear>(h: Tensor<B, 2>) -> Result<Tensor<B, 2>> {
    activation(
        h,
        &ActivationSpec {
            activation: Activation::Swiglu,
            params: ActivationParams::default(),
        },
    )
}

/// `rope.forward(x)` for Burn's `RotaryEncoding` on `x [batch, heads, seq, head]` (positions
/// from the start of its frequency table, as `forward`): each pair of elements rotated in one
/// kernel forward and one backward. The products and their difference are f32, rounded once to
/// x's dtype (Burn rounds each product to x's dtype first).
pub fn rope<B: LowpLinear>(rope: &RotaryEncoding<B>, x: Tensor<B, 4>) -> Result<Tensor<B, 4>> {
    let [batch, heads, seq, head] = x.dims();
    let y = B::lowp_rope(
        x.reshape([batch * heads * seq, head]).into_primitive().tensor(),
        rope.freq_complex.clone().into_primitive().tensor(),
        RopePositions { seq, start: 0 },
    )?;
    let y: Tensor<B, 2> = Tensor::from_primitive(TensorPrimitive::Float(y));
    Ok(y.reshape([batch, heads, seq, head]))
}
