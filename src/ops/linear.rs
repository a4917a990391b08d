//! The quantized linear op `Y = X · Wᵀ` (`X [M, K]`, `W [N, K]`, TE's layout) as one
//! differentiable op. Forward quantizes X (rowwise, plus columnwise when W needs a gradient) and W
//! (rowwise, plus columnwise when X needs one), runs the fprop GEMM, and saves only the quantized
//! columnwise copies. Backward quantizes dY once (rowwise for dgrad, columnwise for wgrad) and runs
//! `dX = dY · W` and `dW = dYᵀ · X` quantized. An optional bias is added by the fprop GEMM
//! (cuBLASLt's epilogue on CUDA, `GemmOptions::bias`) and its gradient is dY's column sums.

use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::Autodiff;
use burn::tensor::ops::FloatTensor;
use burn::tensor::{FloatDType, TensorMetadata};

use super::lowp_linear::gemm_dtype;
use super::operand::{dims, quantize_weight, OperandQuantizer, WeightOperand};
use crate::backend::{GemmCall, GemmKind, GemmOptions, LowpBackend};
use crate::debug::layer::direction_for;
use crate::debug::{GemmName, LayerDebug, Operand, TensorKind};
use crate::error::{LowpError, Result};
use crate::format::{Direction, Usage};
use crate::quant::{QuantizedTensor, Storage};
use crate::recipe::SplitAccumulator;

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

/// The linear op on `Autodiff<B>` (`LowpLinear::lowp_linear`): forward on the inner tensors, the
/// columnwise copies backward needs saved only if the op is tracked.
pub(crate) fn linear_autodiff<B: LowpBackend, C: CheckpointStrategy>(
    x: FloatTensor<Autodiff<B, C>>,
    w: FloatTensor<Autodiff<B, C>>,
    bias: Option<FloatTensor<Autodiff<B, C>>>,
    op: LinearOp<B>,
) -> Result<(FloatTensor<Autodiff<B, C>>, QuantizedTensor<B>)> {
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

/// The linear op on a backend without autodiff: its forward alone.
pub(crate) fn linear_forward_only<Q: LowpBackend>(
    x: FloatTensor<Q>,
    w: FloatTensor<Q>,
    bias: Option<FloatTensor<Q>>,
    op: LinearOp<Q>,
) -> Result<(FloatTensor<Q>, QuantizedTensor<Q>)> {
    let (y, _, qw) = forward(x, w, bias, &op, false, false)?;
    Ok((y, qw))
}
