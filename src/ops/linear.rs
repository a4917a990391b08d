//! The quantized linear op `Y = X · Wᵀ` (`X [M, K]`, `W [N, K]`, TE's layout) as one
//! differentiable op. Forward quantizes X (rowwise, plus columnwise when W needs a gradient) and W
//! (rowwise, plus columnwise when X needs one), runs the fprop GEMM, and saves only the quantized
//! columnwise copies. Backward quantizes dY once (rowwise for dgrad, columnwise for wgrad) and runs
//! `dX = dY · W` and `dW = dYᵀ · X` quantized. An optional bias is added by the fprop GEMM
//! (cuBLASLt's epilogue on CUDA, `GemmOptions::bias`) and its gradient is dY's column sums.

use std::fmt;
use std::sync::Arc;

use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::Autodiff;
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::ops::{FloatTensor, IntTensor};
use burn::tensor::{DType, FloatDType, Shape, TensorMetadata};

use super::grouped_linear::{GroupedLinearOp, InputRows};
use crate::backend::activation::ActivationSpec;
use super::differentiable::DifferentiableOp;
use super::grouped_rows::RowMove;
use crate::backend::NormSpec;
use crate::backend::{
    AmaxHistoryColumns, GemmCall, GemmKind, GemmOptions, GroupLayout, GroupedOps, LowpBackend,
    ScaleColumns,
};
use crate::error::{LowpError, Result};
use crate::debug::layer::direction_for;
use crate::debug::{GemmName, LayerDebug, Operand, TensorKind};
use crate::format::{Direction, Fp8Format, Usage};
use crate::quant::{quantize, DelayedCast, QuantizeCall, QuantizedTensor, QuantizerSpec, Storage};
use crate::recipe::SplitAccumulator;

/// Where a delayed-scaling operand's amaxes go: row 0 of its module's amax history, group g's
/// (a plain tensor's: g = 0) into column `first + g * stride`. Read when the cast runs, so that a
/// backward cast records into the history of its step.
#[derive(Clone)]
pub struct AmaxSink<Q: LowpBackend> {
    /// The module's history now (`[len, width]` f32): casts that record in place write into it.
    pub history: Arc<dyn Fn() -> FloatTensor<Q> + Send + Sync>,
    /// Records amaxes (`[groups]` f32) with tensor ops, for backends whose casts cannot.
    pub record: Arc<dyn Fn(FloatTensor<Q>) + Send + Sync>,
    pub first: usize,
    pub stride: usize,
}

impl<Q: LowpBackend> fmt::Debug for AmaxSink<Q> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "AmaxSink(columns {} + g * {})", self.first, self.stride)
    }
}

impl<Q: LowpBackend> AmaxSink<Q> {
    /// The history columns a cast on this backend records into itself, if it can.
    pub fn in_place(&self) -> Option<AmaxHistoryColumns<Q>> {
        Q::quantize_delayed_amax_in_place().then(|| AmaxHistoryColumns {
            history: (self.history)(),
            first: self.first,
            stride: self.stride,
        })
    }

    /// After a cast of `groups` groups: records its amaxes with tensor ops unless the cast did.
    pub fn after_cast(&self, q: &QuantizedTensor<Q>, usage: Usage, groups: usize) -> Result<()> {
        if Q::quantize_delayed_amax_in_place() {
            return Ok(());
        }
        let direction = if usage.rowwise {
            Direction::Rowwise
        } else {
            Direction::Columnwise
        };
        if let Some(amax) = q.quantized(direction)?.amax.as_ref() {
            (self.record)(Q::float_reshape(
                Q::bytes_as_float(amax, [1, groups]),
                Shape::new([groups]),
            ));
        }
        Ok(())
    }
}

/// A delayed-scaling slot: its current scale (a column of the module's scales), element format
/// and amax sink.
#[derive(Clone, Debug)]
pub struct DelayedSlot<Q: LowpBackend> {
    pub scale: ScaleColumns<Q>,
    pub fp8: Fp8Format,
    pub sink: AmaxSink<Q>,
}

/// How one operand is quantized: its slot's quantizer, the delayed-scaling slot if the quantizer
/// is a delayed request, and the stochastic-rounding seed of this call.
#[derive(Clone, Debug)]
pub struct OperandQuantizer<Q: LowpBackend> {
    pub name: String,
    pub spec: QuantizerSpec,
    pub delayed: Option<DelayedSlot<Q>>,
    pub seed: u64,
}

impl<Q: LowpBackend> OperandQuantizer<Q> {
    pub fn quantize(
        &self,
        x: FloatTensor<Q>,
        usage: Usage,
        optimize_for_gemm: bool,
    ) -> Result<QuantizedTensor<Q>> {
        let call = QuantizeCall {
            seed: self.seed,
            delayed: self.delayed.as_ref().map(|d| DelayedCast {
                scales: d.scale.clone(),
                fp8: d.fp8,
                record: d.sink.in_place(),
            }),
        };
        let q = quantize(x, &self.spec, usage, optimize_for_gemm, &call)?;
        if let Some(delayed) = &self.delayed {
            delayed.sink.after_cast(&q, usage, 1)?;
        }
        Ok(q)
    }

    /// Whether this quantizer would use an amax taken by the tensor's producer (FP8 current
    /// scaling; see `quantize_with_amax`).
    pub fn takes_amax(&self) -> bool {
        matches!(self.spec, QuantizerSpec::Fp8Current { .. })
    }

    /// As `quantize`, with `x`'s amax already on the device when its producer fused it (FP8
    /// current scaling then skips its amax pass; other quantizers ignore it).
    pub fn quantize_with_amax(
        &self,
        x: FloatTensor<Q>,
        amax: Option<Q::Bytes>,
        usage: Usage,
    ) -> Result<QuantizedTensor<Q>> {
        match amax {
            Some(amax) if self.takes_amax() => Q::quantize_fp8_current_with_amax(
                x,
                &self.spec.format_config(Some(self.seed))?,
                &amax,
                usage,
            ),
            _ => self.quantize(x, usage, false),
        }
    }
}

impl<Q: LowpBackend> OperandQuantizer<Q> {
    /// The activation of `h` (`spec`) quantized by this quantizer without the activation's
    /// output in memory, where the backend fuses the activation into its FP8 cast:
    /// - delayed scaling, one pass (`LowpBackend::act_quantize_fp8_with_scale`);
    /// - current scaling, an amax pass over the activation and then the cast
    ///   (`act_quantize_fp8_current`). It reads `h` twice and computes the activation
    ///   twice, where the activation pass and the cast read `h`, write the output and read it
    ///   back. It measured slower with the earlier activation kernels (`tanhf`, IEEE division,
    ///   integer bf16 rounding; gelu at 8192 x 16384: 423 us against 388 us on an H200,
    ///   `benches/results/turns-h100/h200-final/mlp-pass.jsonl`); with the logistic on the GPU's
    ///   exponential and reciprocal units and the conversion instruction it is the shorter way
    ///   (H100, both directions: 330.5 us against 425.9 us for gelu, 494.1 against 510.7 for
    ///   swiglu; `benches/results/act-h100/call3/passes.jsonl`).
    ///
    /// `None` otherwise, and the caller runs the activation and then this quantizer (the same
    /// codes).
    pub fn quantize_activation(
        &self,
        h: FloatTensor<Q>,
        spec: &ActivationSpec,
        usage: Usage,
    ) -> Result<Option<QuantizedTensor<Q>>> {
        match (&self.spec, &self.delayed) {
            (QuantizerSpec::Fp8Delayed(_), Some(d)) => {
                let q = Q::act_quantize_fp8_with_scale(
                    h,
                    spec,
                    d.fp8,
                    d.scale.clone(),
                    usage,
                    d.sink.in_place(),
                )?;
                if let Some(q) = &q {
                    d.sink.after_cast(q, usage, 1)?;
                }
                Ok(q)
            }
            (QuantizerSpec::Fp8Current { .. }, _) => Q::act_quantize_fp8_current(
                h,
                spec,
                &self.spec.format_config(Some(self.seed))?,
                usage,
            ),
            _ => Ok(None),
        }
    }
}

/// The weight operand: quantize it in this call, or reuse a quantized copy (micro-batch cache).
#[derive(Clone, Debug)]
pub enum WeightOperand<Q: LowpBackend> {
    Quantize(OperandQuantizer<Q>),
    Cached(QuantizedTensor<Q>),
}

/// Everything the op needs besides X and W.
#[derive(Clone, Debug)]
pub struct LinearOp<Q: LowpBackend> {
    pub input: OperandQuantizer<Q>,
    pub weight: WeightOperand<Q>,
    pub grad_output: OperandQuantizer<Q>,
    /// The layer's debug view when a debug session selects it (`debug::LayerDebug`).
    pub debug: Option<LayerDebug>,
    /// How its FP8 per-tensor GEMMs accumulate (the recipe's `fp8_gemm_*`).
    pub split_accumulator: SplitAccumulator,
}

/// A debug tool's failure inside backward (which cannot return errors): said once on stderr,
/// and training goes on as without the tool.
pub(crate) fn debug_or_warn<T>(result: Result<T>, what: &str) -> Option<T> {
    match result {
        Ok(v) => Some(v),
        Err(e) => {
            static WARNED: std::sync::Once = std::sync::Once::new();
            WARNED.call_once(|| eprintln!("burn-lowp debug: {what}: {e} (later failures are not shown)"));
            None
        }
    }
}

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
    /// device; `LowpBackend::group_layout`). Autodiff's Int tensors are its inner backend's.
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

fn dims(t: &impl TensorMetadata) -> Vec<usize> {
    t.shape().as_slice().to_vec()
}

/// The weight operand of a GEMM: the cached copy (checked to hold what this call needs) or `w`
/// quantized rowwise, plus columnwise when dgrad will read it.
pub(crate) fn quantize_weight<Q: LowpBackend>(
    weight: &WeightOperand<Q>,
    w: FloatTensor<Q>,
    need_columnwise: bool,
) -> Result<QuantizedTensor<Q>> {
    let ws = dims(&w);
    match weight {
        WeightOperand::Cached(q) => {
            if q.rowwise.is_none()
                || (need_columnwise && q.columnwise.is_none())
                || (q.rows, q.cols) != (ws[0], ws[1])
            {
                return Err(LowpError::invalid(
                    "cached weight",
                    format!("[{}, {}] {:?}", q.rows, q.cols, q.usage()),
                    "lacks a representation this call needs",
                ));
            }
            Ok(q.clone())
        }
        WeightOperand::Quantize(quantizer) => quantizer.quantize(
            w,
            Usage {
                rowwise: true,
                columnwise: need_columnwise,
            },
            false,
        ),
    }
}

/// Quantizes both operands and runs fprop (adding `bias` in the GEMM); `need_dgrad` /
/// `need_wgrad` add the columnwise copies the backward GEMMs read.
fn forward<Q: LowpBackend>(
    x: FloatTensor<Q>,
    w: FloatTensor<Q>,
    bias: Option<FloatTensor<Q>>,
    op: &LinearOp<Q>,
    need_dgrad: bool,
    need_wgrad: bool,
) -> Result<(FloatTensor<Q>, QuantizedTensor<Q>, QuantizedTensor<Q>)> {
    let (xs, ws) = (dims(&x), dims(&w));
    // GEMM outputs take the activation's dtype (BF16 models get BF16 outputs).
    let out_dtype = gemm_dtype(x.dtype());
    if xs.len() != 2 || ws.len() != 2 || xs[1] != ws[1] {
        return Err(LowpError::shape(
            "linear input",
            format!("x {xs:?}, w {ws:?}"),
            "x is [M, K] and w is [N, K]",
        ));
    }
    if let Some(bias) = &bias {
        if dims(bias) != [ws[0]] {
            return Err(LowpError::shape(
                "linear bias",
                format!("{:?}", dims(bias)),
                format!("must be [out_features] = [{}]", ws[0]),
            ));
        }
    }
    if need_dgrad || need_wgrad {
        // dY [M, N] must suit its quantizer too; say so now rather than fail inside backward.
        op.grad_output
            .spec
            .check_shape(&op.grad_output.name, xs[0], ws[0])?;
    }
    let originals = op.debug.as_ref().map(|_| (x.clone(), w.clone()));
    let qx = op.input.quantize(
        x,
        Usage {
            rowwise: true,
            columnwise: need_wgrad,
        },
        false,
    )?;
    let qw = quantize_weight(&op.weight, w, need_dgrad)?;
    let options = GemmOptions {
        out_dtype,
        accumulate: None,
        split_accumulator: Some(op.split_accumulator.fprop),
        bias: bias.map(|b| Q::float_cast(b, out_dtype)),
    };
    let y = fprop(
        op.debug.as_ref(),
        originals.as_ref().map(|(x, w)| (x, w)),
        &qx,
        &qw,
        options,
    )?;
    Ok((y, qx, qw))
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
                let (y, _, qw) = forward(x, w, bias, &op, false, false)?;
                Ok((y, qw))
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

/// The fprop GEMM of quantized `qx` and `qw`; under a debug view, with the high-precision
/// `originals` (X, W): both observed, the operands as the features say, the output observed.
pub(crate) fn fprop<Q: LowpBackend>(
    debug: Option<&LayerDebug>,
    originals: Option<(&FloatTensor<Q>, &FloatTensor<Q>)>,
    qx: &QuantizedTensor<Q>,
    qw: &QuantizedTensor<Q>,
    options: GemmOptions<Q>,
) -> Result<FloatTensor<Q>> {
    let (Some(debug), Some((x, w))) = (debug, originals) else {
        return Q::gemm_quantized(GemmKind::Fprop, qx, qw, options);
    };
    debug.observe(TensorKind::Activation, x, Some(qx))?;
    debug.observe(TensorKind::Weight, w, Some(qw))?;
    let (a, b) = debug.operands(
        GemmName::Fprop,
        Operand {
            tensor: TensorKind::Activation,
            high_precision: Some(x),
            quantized: qx,
            direction: Direction::Rowwise,
        },
        Operand {
            tensor: TensorKind::Weight,
            high_precision: Some(w),
            quantized: qw,
            direction: Direction::Rowwise,
        },
        options.out_dtype,
    )?;
    let y = Q::gemm_quantized(GemmKind::Fprop, &a, &b, options)?;
    debug.observe::<Q>(TensorKind::Output, &y, None)?;
    Ok(y)
}

/// What backward needs: the saved columnwise operands and dY's quantizer; under a debug view,
/// the high-precision X and W when a backward GEMM may run on them.
#[derive(Clone, Debug)]
struct LinearSaved<Q: LowpBackend> {
    x_columnwise: Option<QuantizedTensor<Q>>,
    w_columnwise: Option<QuantizedTensor<Q>>,
    grad_output: OperandQuantizer<Q>,
    debug: Option<DebugSaved<Q>>,
    split_accumulator: SplitAccumulator,
    /// The bias's dtype, when it needs a gradient.
    bias_dtype: Option<FloatDType>,
}

/// A debug view and the originals it may need in backward.
#[derive(Clone, Debug)]
pub(crate) struct DebugSaved<Q: LowpBackend> {
    pub debug: LayerDebug,
    pub x: Option<FloatTensor<Q>>,
    pub w: Option<FloatTensor<Q>>,
}

/// dgrad and wgrad under a debug view: dY observed, each GEMM's operands as the features say
/// (falling back to the quantized ones if a tool fails), the outputs observed.
pub(crate) fn debugged_dgrad_and_wgrad<Q: LowpBackend>(
    saved: &DebugSaved<Q>,
    dy: &FloatTensor<Q>,
    qdy: &QuantizedTensor<Q>,
    w_columnwise: Option<&QuantizedTensor<Q>>,
    x_columnwise: Option<&QuantizedTensor<Q>>,
    out_dtype: FloatDType,
    split: SplitAccumulator,
) -> (Option<FloatTensor<Q>>, Option<FloatTensor<Q>>) {
    let d = &saved.debug;
    debug_or_warn(d.observe(TensorKind::Gradient, dy, Some(qdy)), "gradient statistics");
    // `gemm`'s operands (dY and `other`, whose original the forward may have kept), falling back
    // to the quantized ones if a tool fails.
    let operands = |gemm: GemmName,
                    tensor: TensorKind,
                    original: Option<&FloatTensor<Q>>,
                    other: &QuantizedTensor<Q>| {
        let chosen = d.operands(
            gemm,
            Operand {
                tensor: TensorKind::Gradient,
                high_precision: Some(dy),
                quantized: qdy,
                direction: direction_for(TensorKind::Gradient, gemm),
            },
            Operand {
                tensor,
                high_precision: original,
                quantized: other,
                direction: direction_for(tensor, gemm),
            },
            out_dtype,
        );
        debug_or_warn(chosen, &format!("{} operands", gemm.name()))
            .unwrap_or_else(|| (qdy.clone(), other.clone()))
    };
    let dgrad = w_columnwise.map(|w| operands(GemmName::Dgrad, TensorKind::Weight, saved.w.as_ref(), w));
    let wgrad = x_columnwise
        .map(|x| operands(GemmName::Wgrad, TensorKind::Activation, saved.x.as_ref(), x));
    let (dx, dw) = dgrad_and_wgrad::<Q>(
        dgrad.as_ref().map(|(a, b)| (a, b)),
        wgrad.as_ref().map(|(a, b)| (a, b)),
        out_dtype,
        split,
    );
    if let Some(dx) = &dx {
        debug_or_warn(d.observe::<Q>(TensorKind::Dgrad, dx, None), "dgrad statistics");
    }
    if let Some(dw) = &dw {
        debug_or_warn(d.observe::<Q>(TensorKind::Wgrad, dw, None), "wgrad statistics");
    }
    (dx, dw)
}

/// The op's backward; its parents are X, W and, with `N = 3`, the bias (no placeholder tensor
/// for a layer without one).
#[derive(Debug)]
struct LinearBackward<const N: usize>;

impl<Q: LowpBackend, const N: usize> Backward<Q, N> for LinearBackward<N> {
    type State = LinearSaved<Q>;

    fn backward(
        self,
        ops: Ops<Self::State, N>,
        grads: &mut Gradients,
        _checkpointer: &mut Checkpointer,
    ) {
        let node_x = ops.parents[0].clone();
        let node_w = ops.parents[1].clone();
        let node_bias = ops.parents.get(2).cloned().flatten();
        let dy = grads.consume::<Q>(&ops.node);
        // dbias and, where fused, dY's amax for its FP8 current-scaling cast, in one read of dY.
        let dy_amax = match (node_bias, ops.state.bias_dtype) {
            (Some(node), Some(dtype)) => {
                let (dbias, amax) = Q::act_dbias_amax(dy.clone()).expect("dbias of dY [rows, cols]");
                grads.register::<Q>(node.id, Q::float_cast(dbias, dtype));
                amax
            }
            _ => None,
        };
        let out_dtype = gemm_dtype(dy.dtype());
        let saved = ops.state;
        let usage = Usage {
            rowwise: node_x.is_some(),
            columnwise: node_w.is_some(),
        };
        let dy_original = saved.debug.as_ref().map(|_| dy.clone());
        // Shapes were checked in forward, so failures here are bugs, not user input.
        let qdy = saved
            .grad_output
            .quantize_with_amax(dy, dy_amax, usage)
            .expect("quantize dY (shapes checked in forward)");
        let dgrad = node_x.zip(saved.w_columnwise.as_ref());
        let wgrad = node_w.zip(saved.x_columnwise.as_ref());
        let (dx, dw) = match (&saved.debug, &dy_original) {
            (Some(debug), Some(dy)) => debugged_dgrad_and_wgrad::<Q>(
                debug,
                dy,
                &qdy,
                dgrad.as_ref().map(|(_, w)| *w),
                wgrad.as_ref().map(|(_, x)| *x),
                out_dtype,
                saved.split_accumulator,
            ),
            _ => dgrad_and_wgrad::<Q>(
                dgrad.as_ref().map(|(_, w)| (&qdy, *w)),
                wgrad.as_ref().map(|(_, x)| (&qdy, *x)),
                out_dtype,
                saved.split_accumulator,
            ),
        };
        if let (Some((node, _)), Some(dx)) = (dgrad, dx) {
            grads.register::<Q>(node.id, dx);
        }
        if let (Some((node, _)), Some(dw)) = (wgrad, dw) {
            grads.register::<Q>(node.id, dw);
        }
    }
}

/// A layer's dgrad (`dX = dY · W`, operands `(dY, W)`) and wgrad (`dW = dYᵀ · X`, operands
/// `(dY, X)`), whichever are asked for, as one GEMM group: on CUDA one ordering handshake for both.
/// Shapes were checked in forward, so a failure here is a bug, not user input.
pub(crate) fn dgrad_and_wgrad<'a, Q: LowpBackend>(
    dgrad: Option<(&'a QuantizedTensor<Q>, &'a QuantizedTensor<Q>)>,
    wgrad: Option<(&'a QuantizedTensor<Q>, &'a QuantizedTensor<Q>)>,
    out_dtype: FloatDType,
    split: SplitAccumulator,
) -> (Option<FloatTensor<Q>>, Option<FloatTensor<Q>>) {
    let call = |kind, (a, b): (&'a QuantizedTensor<Q>, &'a QuantizedTensor<Q>)| GemmCall {
        kind,
        a,
        b,
        options: GemmOptions {
            out_dtype,
            accumulate: None,
            split_accumulator: Some(split.of(kind)),
            bias: None,
        },
    };
    let calls: Vec<GemmCall<'a, Q>> = [
        dgrad.map(|ab| call(GemmKind::Dgrad, ab)),
        wgrad.map(|ab| call(GemmKind::Wgrad, ab)),
    ]
    .into_iter()
    .flatten()
    .collect();
    let mut outputs = Q::gemm_group(calls)
        .expect("backward GEMMs (shapes checked in forward)")
        .into_iter();
    let dx = dgrad.and_then(|_| outputs.next());
    let dw = wgrad.and_then(|_| outputs.next());
    (dx, dw)
}

/// Keeps only the columnwise representation (identity storages stay as they are).
pub(crate) fn columnwise_only<Q: LowpBackend>(q: QuantizedTensor<Q>) -> Result<QuantizedTensor<Q>> {
    match (&q.rowwise, &q.columnwise) {
        (_, Some(_)) => q.narrow(Usage::COLUMNWISE),
        (Some(Storage::HighPrecision(_)), None) => Ok(q),
        _ => Err(LowpError::invalid(
            "saved operand",
            "rowwise only",
            "backward needs the columnwise copy",
        )),
    }
}

impl<B: LowpBackend, C: CheckpointStrategy> LowpLinear for Autodiff<B, C> {
    type Quant = B;

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

    fn lowp_linear(
        x: FloatTensor<Self>,
        w: FloatTensor<Self>,
        bias: Option<FloatTensor<Self>>,
        op: LinearOp<B>,
    ) -> Result<(FloatTensor<Self>, QuantizedTensor<B>)> {
        let (need_dgrad, need_wgrad) = (x.is_tracked(), w.is_tracked());
        let bias_dtype = bias
            .as_ref()
            .filter(|b| b.is_tracked())
            .map(|b| crate::backend::float_dtype(b.primitive.dtype()));
        let debug = op.debug.clone().map(|debug| {
            let keep = debug.keeps_originals();
            DebugSaved {
                x: (keep && need_wgrad).then(|| x.primitive.clone()),
                w: (keep && need_dgrad).then(|| w.primitive.clone()),
                debug,
            }
        });
        let (y, qx, qw) = forward(
            x.primitive.clone(),
            w.primitive.clone(),
            bias.as_ref().map(|b| b.primitive.clone()),
            &op,
            need_dgrad,
            need_wgrad,
        )?;
        // Built only if the op is tracked.
        let saved = || -> Result<LinearSaved<B>> {
            Ok(LinearSaved {
                x_columnwise: need_wgrad.then(|| columnwise_only(qx)).transpose()?,
                w_columnwise: need_dgrad.then(|| columnwise_only(qw.clone())).transpose()?,
                grad_output: op.grad_output,
                debug,
                split_accumulator: op.split_accumulator,
                bias_dtype,
            })
        };
        let out = match &bias {
            Some(bias) => register_linear::<B, C, 3>([&x, &w, bias], saved, y)?,
            None => register_linear::<B, C, 2>([&x, &w], saved, y)?,
        };
        Ok((out, qw))
    }
}

/// Registers the linear op in the autodiff graph with `parents` (X, W and the bias if any).
fn register_linear<B: LowpBackend, C: CheckpointStrategy, const N: usize>(
    parents: [&FloatTensor<Autodiff<B, C>>; N],
    saved: impl FnOnce() -> Result<LinearSaved<B>>,
    y: FloatTensor<B>,
) -> Result<FloatTensor<Autodiff<B, C>>> {
    Ok(
        match LinearBackward::<N>
            .prepare::<C>(parents.map(|t| t.node.clone()))
            .compute_bound()
            .stateful()
        {
            OpsKind::Tracked(prep) => prep.finish(saved()?, y),
            OpsKind::UnTracked(prep) => prep.finish(y),
        },
    )
}
