//! `LowpLinear`: the backends the quantized ops run on, and how each op reaches the backend that
//! quantizes and multiplies (`Quant`: the backend itself, or the inner backend of `Autodiff`).
//! Plain backends run each op's forward alone; `Autodiff` registers the op's backward, which
//! runs on the inner backend. One method per op family (linear, grouped linear, LayerNormMLP,
//! token routing, row moves and broadcasts, norm, activation, self-attention), and
//! `lowp_differentiable` for the ops written as a `DifferentiableOp`.

use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::Autodiff;
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::ops::{FloatTensor, IntTensor};
use burn::tensor::{DType, FloatDType};

use super::differentiable::DifferentiableOp;
use super::grouped_linear::{GroupedLinearOp, InputRows};
use super::grouped_rows::RowMove;
use super::linear::LinearOp;
use crate::backend::activation::ActivationSpec;
use crate::backend::{GroupLayout, GroupedOps, LowpBackend, NormSpec};
use crate::error::Result;
use crate::quant::QuantizedTensor;

/// Backends with the quantized linear op. `Quant` is the backend that quantizes and multiplies:
/// the backend itself, or the inner backend of `Autodiff`.
pub trait LowpLinear: Backend {
    type Quant: LowpBackend;

    fn to_quant(t: FloatTensor<Self>) -> FloatTensor<Self::Quant>;
    fn from_quant(t: FloatTensor<Self::Quant>) -> FloatTensor<Self>;

    /// `Y = X · Wᵀ [+ bias]` for `x [M, K]`, `w [N, K]`, `bias [N]`; returns Y and the quantized
    /// weight (for caching).
    fn lowp_linear(
        x: FloatTensor<Self>,
        w: FloatTensor<Self>,
        bias: Option<FloatTensor<Self>>,
        op: LinearOp<Self::Quant>,
    ) -> Result<(FloatTensor<Self>, QuantizedTensor<Self::Quant>)>;

    /// `y [M, N] + bias [N]` broadcast over rows (see `ops/row_broadcast.rs` for its backward).
    fn lowp_add_bias(y: FloatTensor<Self>, bias: FloatTensor<Self>) -> FloatTensor<Self> {
        super::row_broadcast::add_bias_rows::<Self>(y, bias)
    }

    /// `x [M, K] * gamma [K]` broadcast over rows (LayerNorm's scale).
    fn lowp_mul_rows(x: FloatTensor<Self>, gamma: FloatTensor<Self>) -> FloatTensor<Self> {
        super::row_broadcast::mul_rows::<Self>(x, gamma)
    }

    /// The grouped linear op (`ops/grouped_linear.rs`) on `x` (the aligned batch `[rows, K]` of
    /// `layout`, or its packed tokens `[tokens, K]`, as `input_rows` says), the stacked weights
    /// `w [E * N, K]` and the experts' biases `[E, N]`; returns Y laid out as `x` and the
    /// quantized weights (for caching).
    fn lowp_grouped_linear(
        x: FloatTensor<Self>,
        input_rows: InputRows,
        w: FloatTensor<Self>,
        bias: Option<FloatTensor<Self>>,
        layout: &GroupLayout<Self::Quant>,
        op: GroupedLinearOp<Self::Quant>,
    ) -> Result<(FloatTensor<Self>, QuantizedTensor<Self::Quant>)>;

    /// The LayerNormMLP op (`ops/layernorm_mlp.rs`); returns the output and both quantized
    /// weights (for caching).
    fn lowp_layernorm_mlp(
        inputs: super::layernorm_mlp::MlpInputs<FloatTensor<Self>>,
        op: super::layernorm_mlp::MlpOp<Self::Quant>,
    ) -> Result<(
        FloatTensor<Self>,
        QuantizedTensor<Self::Quant>,
        QuantizedTensor<Self::Quant>,
    )>;

    /// The aligned layout of `tokens` packed tokens split by `m_splits` (an Int tensor on the
    /// device; `GroupedOps::grouped_layout`). Autodiff's Int tensors are its inner backend's.
    fn lowp_group_layout(
        m_splits: IntTensor<Self>,
        tokens: usize,
    ) -> Result<GroupLayout<Self::Quant>>;

    /// Int tensors to and from `Quant` (the same tensors: autodiff tracks no Int tensor).
    fn int_to_quant(t: IntTensor<Self>) -> IntTensor<Self::Quant>;
    fn int_from_quant(t: IntTensor<Self::Quant>) -> IntTensor<Self>;

    /// `op`, a differentiable op with its own backward (`ops::differentiable`), on `inputs`:
    /// registered in the graph on `Autodiff`, its forward alone elsewhere. RoPE
    /// (`RopeOp`), the causal softmax (`CausalSoftmaxOp`) and batched products
    /// (`BatchedMatmulOp`) run through here.
    fn lowp_differentiable<const N: usize, Op: DifferentiableOp<Self::Quant, N>>(
        inputs: [FloatTensor<Self>; N],
        op: Op,
    ) -> Result<FloatTensor<Self>> {
        let (y, _) = op.forward(inputs.map(Self::to_quant), [false; N])?;
        Ok(Self::from_quant(y))
    }

    /// Token rows into the experts' aligned batch (`ops/token_routing.rs`).
    fn lowp_dispatch(
        x: FloatTensor<Self>,
        routes: &super::TokenRoutes<Self::Quant>,
    ) -> FloatTensor<Self> {
        Self::from_quant(super::token_routing::dispatch_rows(Self::to_quant(x), routes))
    }

    /// The experts' aligned rows back to tokens, weighted by the router (`ops/token_routing.rs`).
    fn lowp_combine(
        y: FloatTensor<Self>,
        weights: FloatTensor<Self>,
        routes: &super::TokenRoutes<Self::Quant>,
    ) -> Result<FloatTensor<Self>> {
        Ok(Self::from_quant(super::token_routing::combine_rows(
            Self::to_quant(y),
            Self::to_quant(weights),
            routes,
        )?))
    }

    /// Rows between the packed and aligned layouts of `layout` (`ops/grouped_rows.rs`).
    fn lowp_move_rows(
        t: FloatTensor<Self>,
        layout: &GroupLayout<Self::Quant>,
        direction: RowMove,
    ) -> FloatTensor<Self> {
        Self::from_quant(super::grouped_rows::move_rows(
            Self::to_quant(t),
            layout,
            direction,
        ))
    }

    /// RMSNorm (or LayerNorm without β) of the rows of `x [rows, cols]` with `gamma [cols]`, one
    /// pass each way (`ops/norm_op.rs`).
    fn lowp_norm_rows(
        x: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        spec: &NormSpec,
    ) -> Result<FloatTensor<Self>> {
        Ok(Self::from_quant(super::norm_op::norm_rows::<Self::Quant>(
            Self::to_quant(x),
            Self::to_quant(gamma),
            spec,
        )?))
    }

    /// Causal self-attention of QKV rows with RoPE on q and k, one differentiable op whose head
    /// split and merge are one kernel each way (`ops/attention_op.rs`).
    fn lowp_causal_self_attention(
        qkv: FloatTensor<Self>,
        freq: FloatTensor<Self>,
        layout: super::attention_op::HeadLayout,
        scale: f32,
    ) -> Result<FloatTensor<Self>> {
        let (y, _) = super::attention_op::causal_self_attention_rows::<Self::Quant>(
            Self::to_quant(qkv),
            Self::to_quant(freq),
            layout,
            scale,
        )?;
        Ok(Self::from_quant(y))
    }

    /// An activation (`backend::activation`) of the rows of `h`, one pass each way
    /// (`ops/activation_op.rs`).
    fn lowp_activation_rows(
        h: FloatTensor<Self>,
        spec: &ActivationSpec,
    ) -> Result<FloatTensor<Self>> {
        Ok(Self::from_quant(super::activation_op::activation_rows::<Self::Quant>(
            Self::to_quant(h),
            spec,
        )?))
    }
}

/// The GEMM output dtype for activations of `dtype`: the same where it is a GEMM output type.
pub(crate) fn gemm_dtype(dtype: DType) -> FloatDType {
    crate::backend::float_dtype(dtype)
}

macro_rules! forward_only_linear {
    ($($backend:ty => [$($generics:tt)*]),*) => {$(
        impl<$($generics)*> LowpLinear for $backend {
            type Quant = Self;
            fn to_quant(t: FloatTensor<Self>) -> FloatTensor<Self> { t }
            fn from_quant(t: FloatTensor<Self>) -> FloatTensor<Self> { t }
            fn int_to_quant(t: IntTensor<Self>) -> IntTensor<Self> { t }
            fn int_from_quant(t: IntTensor<Self>) -> IntTensor<Self> { t }
            fn lowp_linear(x: FloatTensor<Self>, w: FloatTensor<Self>, bias: Option<FloatTensor<Self>>, op: LinearOp<Self>) -> Result<(FloatTensor<Self>, QuantizedTensor<Self>)> {
                super::linear::linear_forward_only(x, w, bias, op)
            }
            fn lowp_grouped_linear(x: FloatTensor<Self>, input_rows: InputRows, w: FloatTensor<Self>, bias: Option<FloatTensor<Self>>, layout: &GroupLayout<Self>, op: GroupedLinearOp<Self>) -> Result<(FloatTensor<Self>, QuantizedTensor<Self>)> {
                super::grouped_linear::grouped_linear_forward_only(x, input_rows, w, bias, layout, op)
            }
            fn lowp_group_layout(m_splits: IntTensor<Self>, tokens: usize) -> Result<GroupLayout<Self>> {
                <Self as GroupedOps<Self>>::grouped_layout(m_splits, tokens)
            }
            fn lowp_layernorm_mlp(inputs: super::layernorm_mlp::MlpInputs<FloatTensor<Self>>, op: super::layernorm_mlp::MlpOp<Self>) -> Result<(FloatTensor<Self>, QuantizedTensor<Self>, QuantizedTensor<Self>)> {
                super::layernorm_mlp::layernorm_mlp_forward_only(inputs, op)
            }
        }
    )*};
}

#[cfg(feature = "ndarray")]
forward_only_linear!(burn::backend::NdArray => []);
#[cfg(any(feature = "wgpu", feature = "cuda"))]
forward_only_linear!(burn_cubecl::CubeBackend<R, F, I, BT> => [R: burn_cubecl::CubeRuntime, F: burn_cubecl::FloatElement, I: burn_cubecl::IntElement, BT: burn_cubecl::BoolElement]);

impl<B: LowpBackend, C: CheckpointStrategy> LowpLinear for Autodiff<B, C> {
    type Quant = B;

    fn lowp_linear(
        x: FloatTensor<Self>,
        w: FloatTensor<Self>,
        bias: Option<FloatTensor<Self>>,
        op: LinearOp<B>,
    ) -> Result<(FloatTensor<Self>, QuantizedTensor<B>)> {
        super::linear::linear_autodiff::<B, C>(x, w, bias, op)
    }

    fn to_quant(t: FloatTensor<Self>) -> FloatTensor<B> {
        <Self as AutodiffBackend>::inner(t)
    }

    fn from_quant(t: FloatTensor<B>) -> FloatTensor<Self> {
        <Self as AutodiffBackend>::from_inner(t)
    }

    fn int_to_quant(t: IntTensor<Self>) -> IntTensor<B> {
        t
    }

    fn int_from_quant(t: IntTensor<B>) -> IntTensor<Self> {
        t
    }

    fn lowp_differentiable<const N: usize, Op: DifferentiableOp<B, N>>(
        inputs: [FloatTensor<Self>; N],
        op: Op,
    ) -> Result<FloatTensor<Self>> {
        super::differentiable::differentiable_autodiff::<B, C, Op, N>(inputs, op)
    }

    fn lowp_dispatch(x: FloatTensor<Self>, routes: &super::TokenRoutes<B>) -> FloatTensor<Self> {
        super::token_routing::dispatch_rows_autodiff::<B, C>(x, routes)
    }

    fn lowp_combine(
        y: FloatTensor<Self>,
        weights: FloatTensor<Self>,
        routes: &super::TokenRoutes<B>,
    ) -> Result<FloatTensor<Self>> {
        super::token_routing::combine_rows_autodiff::<B, C>(y, weights, routes)
    }

    fn lowp_add_bias(y: FloatTensor<Self>, bias: FloatTensor<Self>) -> FloatTensor<Self> {
        super::row_broadcast::add_bias_rows_autodiff::<B, C>(y, bias)
    }

    fn lowp_mul_rows(x: FloatTensor<Self>, gamma: FloatTensor<Self>) -> FloatTensor<Self> {
        super::row_broadcast::mul_rows_autodiff::<B, C>(x, gamma)
    }

    fn lowp_grouped_linear(
        x: FloatTensor<Self>,
        input_rows: InputRows,
        w: FloatTensor<Self>,
        bias: Option<FloatTensor<Self>>,
        layout: &GroupLayout<B>,
        op: GroupedLinearOp<B>,
    ) -> Result<(FloatTensor<Self>, QuantizedTensor<B>)> {
        super::grouped_linear::grouped_linear_autodiff::<B, C>(x, input_rows, w, bias, layout, op)
    }

    fn lowp_group_layout(m_splits: IntTensor<Self>, tokens: usize) -> Result<GroupLayout<B>> {
        B::grouped_layout(m_splits, tokens)
    }

    fn lowp_layernorm_mlp(
        inputs: super::layernorm_mlp::MlpInputs<FloatTensor<Self>>,
        op: super::layernorm_mlp::MlpOp<B>,
    ) -> Result<(FloatTensor<Self>, QuantizedTensor<B>, QuantizedTensor<B>)> {
        super::layernorm_mlp::layernorm_mlp_autodiff::<B, C>(inputs, op)
    }

    fn lowp_move_rows(
        t: FloatTensor<Self>,
        layout: &GroupLayout<B>,
        direction: RowMove,
    ) -> FloatTensor<Self> {
        super::grouped_rows::move_rows_autodiff::<B, C>(t, layout, direction)
    }

    fn lowp_norm_rows(
        x: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        spec: &NormSpec,
    ) -> Result<FloatTensor<Self>> {
        super::norm_op::norm_rows_autodiff::<B, C>(x, gamma, spec)
    }

    fn lowp_activation_rows(
        h: FloatTensor<Self>,
        spec: &ActivationSpec,
    ) -> Result<FloatTensor<Self>> {
        super::activation_op::activation_rows_autodiff::<B, C>(h, spec)
    }

    fn lowp_causal_self_attention(
        qkv: FloatTensor<Self>,
        freq: FloatTensor<Self>,
        layout: super::attention_op::HeadLayout,
        scale: f32,
    ) -> Result<FloatTensor<Self>> {
        super::attention_op::causal_self_attention_autodiff::<B, C>(qkv, freq, layout, scale)
    }
}
