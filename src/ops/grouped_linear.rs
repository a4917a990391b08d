//! The grouped (MoE experts) linear op `Y_g = X_g · W_gᵀ` for every group g of an aligned token
//! batch (`backend::grouped::GroupLayout`), as one differentiable op. Forward quantizes X (one
//! grouped quantize for all experts, each with its own scales) and the stacked weights
//! `W [E * out, in]`, and runs the grouped fprop GEMM; backward quantizes dY once and runs the
//! grouped dgrad and wgrad GEMMs. The weight gradient can go to the autodiff graph, be
//! accumulated into a `main_grad` buffer, or be deferred to `backward_dw` (TE's
//! `delay_wgrad_compute`).

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::Autodiff;
use burn::tensor::ops::{FloatTensor, IntTensor};
use burn::tensor::{FloatDType, TensorMetadata};

use super::linear::{columnwise_only, debug_or_warn};
use super::lowp_linear::gemm_dtype;
use super::operand::AmaxSink;

use super::grouped_rows::{move_rows, RowMove};
use crate::backend::grouped::check_packed_rows;
pub use crate::backend::grouped::InputRows;
use crate::backend::{
    GemmKind, GemmOptions, GroupEpilogue, GroupLayout, GroupedFp8Scaling, GroupedOperand, Groups,
    LowpBackend, ScaleColumns,
};
use crate::debug::layer::ExpertRows;
use crate::debug::{LayerDebug, TensorKind};
use crate::error::{LowpError, Result};
use crate::format::grouped::GroupScaling;
use crate::format::{Fp8CurrentScaling, Fp8Format, Usage};
use crate::quant::grouped::quantize_grouped;
use crate::quant::{DelayedCast, QuantizedTensor, QuantizerSpec};
use crate::recipe::SplitAccumulator;

/// The delayed-scaling slots of one operand for every group: their scale columns, the
/// element format, and where the recorded amaxes go.
#[derive(Clone, Debug)]
pub struct GroupedDelayed<Q: LowpBackend> {
    pub scales: ScaleColumns<Q>,
    pub fp8: Fp8Format,
    pub sink: AmaxSink<Q>,
}

/// How one grouped operand is quantized: one spec for every group (the recipe gives all experts'
/// slots the same role), per-group delayed-scaling slots, this call's rounding seed, and whether
/// FP8 per-tensor groups share one scale.
#[derive(Clone, Debug)]
pub struct GroupedQuantizer<Q: LowpBackend> {
    pub name: String,
    pub spec: QuantizerSpec,
    pub delayed: Option<GroupedDelayed<Q>>,
    pub seed: u64,
    pub scaling: GroupScaling,
}

impl<Q: LowpBackend> GroupedQuantizer<Q> {
    pub fn quantize(
        &self,
        x: FloatTensor<Q>,
        groups: &Groups<Q>,
        usage: Usage,
    ) -> Result<QuantizedTensor<Q>> {
        let delayed = self.delayed.as_ref().map(|d| DelayedCast {
            scales: d.scales.clone(),
            fp8: d.fp8,
            record: d.sink.in_place(),
        });
        let q = quantize_grouped(x, groups, &self.spec, usage, self.seed, delayed, self.scaling)?;
        self.record_amax(&q, groups, usage)?;
        Ok(q)
    }

    /// `quantize` of the packed token rows `x [layout.tokens, cols]` padded into `layout`'s
    /// aligned layout. FP8 per-tensor quantizers (current and delayed) read `x` through the
    /// layout's row map (`GroupedOps::grouped_quantize_fp8_padded`: no padded copy); the other
    /// formats pad first.
    pub fn quantize_padded(
        &self,
        x: FloatTensor<Q>,
        layout: &GroupLayout<Q>,
        usage: Usage,
    ) -> Result<QuantizedTensor<Q>> {
        self.quantize_padded_with_amax(x, layout, usage, None)
    }

    /// `quantize_padded`, where FP8 current scaling takes the per-group amaxes `amax` (f32,
    /// `[groups]`) a producer already took over the padded batch instead of an amax pass.
    pub fn quantize_padded_with_amax(
        &self,
        x: FloatTensor<Q>,
        layout: &GroupLayout<Q>,
        usage: Usage,
        amax: Option<Q::Bytes>,
    ) -> Result<QuantizedTensor<Q>> {
        let scaling = match (&self.spec, &self.delayed) {
            (QuantizerSpec::Fp8Current { fp8, pow2_scales, amax_epsilon }, _) => {
                let config = Fp8CurrentScaling {
                    fp8: *fp8,
                    pow2_scales: *pow2_scales,
                    amax_epsilon: *amax_epsilon,
                };
                match amax {
                    Some(amax) => GroupedFp8Scaling::CurrentFromAmax { config, amax },
                    None => GroupedFp8Scaling::Current(config),
                }
            }
            (QuantizerSpec::Fp8Delayed(_), Some(delayed)) => GroupedFp8Scaling::Delayed {
                fp8: delayed.fp8,
                scales: delayed.scales.clone(),
                record: delayed.sink.in_place(),
            },
            _ => {
                check_packed_rows(&x, layout)?;
                return self.quantize(move_rows(x, layout, RowMove::Pad), &layout.groups, usage);
            }
        };
        let q = Q::grouped_quantize_fp8_padded(x, layout, scaling, usage, self.scaling)?;
        self.record_amax(&q, &layout.groups, usage)?;
        Ok(q)
    }

    /// Hands a delayed-scaling quantization's per-group amaxes to the module's history where
    /// the cast did not record them itself.
    fn record_amax(&self, q: &QuantizedTensor<Q>, groups: &Groups<Q>, usage: Usage) -> Result<()> {
        match &self.delayed {
            Some(delayed) => delayed.sink.after_cast(q, usage, groups.count),
            None => Ok(()),
        }
    }
}

/// The stacked weights: quantized in this call, or a cached quantization (micro-batches).
#[derive(Clone, Debug)]
pub enum GroupedWeight<Q: LowpBackend> {
    Quantize(GroupedQuantizer<Q>),
    Cached(QuantizedTensor<Q>),
}

/// What one deferred weight gradient needs (TE's `WeightGradStore` entry).
#[derive(Clone, Debug)]
pub struct PendingWgrad<Q: LowpBackend> {
    pub grad_output: QuantizedTensor<Q>,
    pub input: QuantizedTensor<Q>,
    pub groups: Groups<Q>,
    pub out_dtype: FloatDType,
    /// The wgrad's FP8 accumulation (`GemmOptions::split_accumulator`).
    pub split_accumulator: bool,
}

/// Where the weight gradient goes.
#[derive(Clone, Debug)]
pub enum WgradTarget<Q: LowpBackend> {
    /// To the autodiff graph (the weight's gradient).
    Graph,
    /// Into `main_grad` (f32 `[E * out, in]`), adding to what it holds unless `overwrite`; the
    /// weight itself gets no gradient (TE's `fuse_wgrad_accumulation`).
    MainGrad {
        main_grad: Arc<Mutex<Option<FloatTensor<Q>>>>,
        overwrite: bool,
    },
    /// Deferred: pushed onto the store for `backward_dw` (TE's `delay_wgrad_compute`).
    Deferred(Arc<Mutex<VecDeque<PendingWgrad<Q>>>>),
}

/// Where backward puts an error it cannot return (Burn's backward has no `Result`): bad splits
/// found when a backward GEMM reads them on the host (the graph-safe forward never does). The
/// module reports it from its next `forward`; the gradients that failed are zeros (the graph
/// must still receive them).
#[derive(Clone, Debug, Default)]
pub struct BackwardErrors(pub Arc<Mutex<Option<LowpError>>>);

impl BackwardErrors {
    fn record(&self, e: LowpError) {
        let mut slot = self.0.lock().expect("backward error lock");
        if slot.is_none() {
            *slot = Some(e);
        }
    }

    /// The first error since the last call.
    pub fn take(&self) -> Option<LowpError> {
        self.0.lock().expect("backward error lock").take()
    }
}

/// A debug session observing a grouped layer this iteration while its GEMMs stay grouped
/// (statistics and `next_sample` AutoswitchGemm metrics; `LayerDebug::changes_expert_gemms`
/// says when that is enough): every grouped tensor is reported once for all experts
/// (`LayerDebug::observe_experts`), its rows labelled by expert on the device (the layout's
/// `row_group` for token rows, `weight_labels` for the weights' and their gradient's), so neither
/// forward nor backward reads the split sizes for it.
#[derive(Clone, Debug)]
pub struct ExpertsDebug<Q: LowpBackend> {
    pub layer: LayerDebug,
    /// The expert of each row of the stacked weights `[E * out, in]`.
    pub weight_labels: IntTensor<Q>,
}

impl<Q: LowpBackend> ExpertsDebug<Q> {
    /// The token rows of `layout`, per expert.
    fn tokens(layout: &GroupLayout<Q>) -> ExpertRows<Q> {
        ExpertRows {
            row_group: layout.row_group.clone(),
            groups: layout.groups.clone(),
            tokens: layout.groups.host.clone(),
        }
    }

    /// The weight rows, per expert (reported for the experts that got tokens in `layout`).
    fn weights(&self, weight_groups: &Groups<Q>, layout: &GroupLayout<Q>) -> ExpertRows<Q> {
        ExpertRows {
            row_group: self.weight_labels.clone(),
            groups: weight_groups.clone(),
            tokens: layout.groups.host.clone(),
        }
    }
}

/// Everything the op needs besides X, W and the layout.
#[derive(Clone, Debug)]
pub struct GroupedLinearOp<Q: LowpBackend> {
    pub input: GroupedQuantizer<Q>,
    pub weight: GroupedWeight<Q>,
    pub grad_output: GroupedQuantizer<Q>,
    /// The weights' groups: group g is rows `g * out .. (g + 1) * out` of `W`.
    pub weight_groups: Groups<Q>,
    pub wgrad: WgradTarget<Q>,
    pub errors: BackwardErrors,
    /// The experts a debug session observes this iteration.
    pub debug: Option<ExpertsDebug<Q>>,
    /// How its FP8 per-tensor GEMMs accumulate (the recipe's `fp8_gemm_*`).
    pub split_accumulator: SplitAccumulator,
}


/// Quantizes X and W, runs the grouped fprop and adds each expert's bias on its token rows; Y
/// comes back laid out as X (`input_rows`). `need_dgrad` / `need_wgrad` add the columnwise
/// copies backward reads.
pub(crate) fn grouped_forward<Q: LowpBackend>(
    x: FloatTensor<Q>,
    input_rows: InputRows,
    w: FloatTensor<Q>,
    bias: Option<FloatTensor<Q>>,
    layout: &GroupLayout<Q>,
    op: &GroupedLinearOp<Q>,
    need_dgrad: bool,
    need_wgrad: bool,
) -> Result<(FloatTensor<Q>, QuantizedTensor<Q>, QuantizedTensor<Q>)> {
    let (xs, ws) = (x.shape().as_slice().to_vec(), w.shape().as_slice().to_vec());
    let (x_rows, which) = (input_rows.rows(layout), input_rows.name());
    if xs.len() != 2 || ws.len() != 2 || xs[1] != ws[1] || xs[0] != x_rows {
        return Err(LowpError::shape(
            "grouped linear input",
            format!("x {xs:?}, w {ws:?}"),
            format!(
                "x is the {which} [{x_rows}, in] batch of its layout and w the stacked [experts * out, in]"
            ),
        ));
    }
    let out_dtype = gemm_dtype(x.dtype());
    // (A debug session observes the aligned batch.)
    let originals = op.debug.as_ref().map(|_| {
        let aligned = match input_rows {
            InputRows::Aligned => x.clone(),
            InputRows::Packed => move_rows(x.clone(), layout, RowMove::Pad),
        };
        (aligned, w.clone())
    });
    let x_usage = Usage {
        rowwise: true,
        columnwise: need_wgrad,
    };
    let qx = match input_rows {
        InputRows::Aligned => op.input.quantize(x, &layout.groups, x_usage)?,
        InputRows::Packed => op.input.quantize_padded(x, layout, x_usage)?,
    };
    let qw = match &op.weight {
        GroupedWeight::Cached(q) => {
            if q.rowwise.is_none()
                || (need_dgrad && q.columnwise.is_none())
                || (q.rows, q.cols) != (ws[0], ws[1])
            {
                return Err(LowpError::invalid(
                    "cached grouped weight",
                    format!("[{}, {}] {:?}", q.rows, q.cols, q.usage()),
                    "lacks a representation this call needs",
                ));
            }
            q.clone()
        }
        GroupedWeight::Quantize(quantizer) => quantizer.quantize(
            w,
            &op.weight_groups,
            Usage {
                rowwise: true,
                columnwise: need_dgrad,
            },
        )?,
    };
    let (y, scales) = Q::grouped_gemm_unscaled(
        GemmKind::Fprop,
        GroupedOperand {
            tensor: &qx,
            groups: &layout.groups,
        },
        GroupedOperand {
            tensor: &qw,
            groups: &op.weight_groups,
        },
        GemmOptions {
            out_dtype,
            accumulate: None,
            split_accumulator: Some(op.split_accumulator.fprop),
            bias: None,
        },
    )?;
    let y = if let (Some(debug), Some((x, w))) = (&op.debug, originals) {
        // (A debug session observes the scaled product, before the biases.)
        let y = finish_output(y, scales, None, InputRows::Aligned, layout);
        let tokens = ExpertsDebug::tokens(layout);
        let weights = debug.weights(&op.weight_groups, layout);
        debug.layer.observe_experts(TensorKind::Activation, &x, Some(&qx), &tokens)?;
        debug.layer.observe_experts(TensorKind::Weight, &w, Some(&qw), &weights)?;
        debug.layer.observe_experts::<Q>(TensorKind::Output, &y, None, &tokens)?;
        finish_output(y, None, bias, input_rows, layout)
    } else {
        finish_output(y, scales, bias, input_rows, layout)
    };
    Ok((y, qx, qw))
}

/// The rest of a grouped GEMM's output in one pass (`GroupedOps::grouped_epilogue`): the
/// per-expert FP8 scales the GEMM left to its consumer (`grouped_gemm_unscaled`), the
/// experts' biases and, for packed rows, the unpad.
fn finish_output<Q: LowpBackend>(
    y: FloatTensor<Q>,
    scales: Option<(FloatTensor<Q>, FloatTensor<Q>)>,
    bias: Option<FloatTensor<Q>>,
    rows: InputRows,
    layout: &GroupLayout<Q>,
) -> FloatTensor<Q> {
    let gather = (rows == InputRows::Packed).then(|| layout.packed_to_aligned.clone());
    match (scales, bias, gather) {
        (None, None, None) => y,
        // (A bare unpad moves whole rows as words.)
        (None, None, Some(_)) => move_rows(y, layout, RowMove::Unpad),
        (scales, bias, gather) => Q::grouped_epilogue(
            y,
            layout.row_group.clone(),
            GroupEpilogue {
                bias,
                scales,
                gather,
            },
        ),
    }
}

/// Runs a deferred (or immediate) grouped wgrad: `dW [E * out, in]`, added to `accumulate`.
pub fn run_wgrad<Q: LowpBackend>(
    pending: &PendingWgrad<Q>,
    accumulate: Option<FloatTensor<Q>>,
) -> Result<FloatTensor<Q>> {
    Q::grouped_gemm(
        GemmKind::Wgrad,
        GroupedOperand {
            tensor: &pending.grad_output,
            groups: &pending.groups,
        },
        GroupedOperand {
            tensor: &pending.input,
            groups: &pending.groups,
        },
        GemmOptions {
            out_dtype: if accumulate.is_some() {
                FloatDType::F32
            } else {
                pending.out_dtype
            },
            accumulate,
            split_accumulator: Some(pending.split_accumulator),
            bias: None,
        },
    )
}


/// What backward needs.
#[derive(Clone, Debug)]
struct GroupedSaved<Q: LowpBackend> {
    x_columnwise: Option<QuantizedTensor<Q>>,
    w_columnwise: Option<QuantizedTensor<Q>>,
    /// How X's rows lie: dX goes back the same way.
    input_rows: InputRows,
    layout: GroupLayout<Q>,
    weight_groups: Groups<Q>,
    grad_output: GroupedQuantizer<Q>,
    wgrad: WgradTarget<Q>,
    errors: BackwardErrors,
    debug: Option<ExpertsDebug<Q>>,
    /// Shapes of X, W and the biases, for the zero gradients of a failed backward.
    x_shape: [usize; 2],
    w_shape: [usize; 2],
    bias_shape: [usize; 2],
    /// The biases' dtype (their f32 gradient is cast to it).
    bias_dtype: FloatDType,
    split_accumulator: SplitAccumulator,
}

#[derive(Debug)]
struct GroupedLinearBackward;

/// Parents: X, W and, where the layer has biases, the biases `[E, out]`.
impl<Q: LowpBackend, const N: usize> Backward<Q, N> for GroupedLinearBackward {
    type State = GroupedSaved<Q>;

    fn backward(self, ops: Ops<Self::State, N>, grads: &mut Gradients, _: &mut Checkpointer) {
        let node_x = ops.parents[0].clone();
        let node_w = ops.parents[1].clone();
        let node_b = ops.parents.get(2).cloned().flatten();
        let dy = grads.consume::<Q>(&ops.node);
        let out_dtype = gemm_dtype(dy.dtype());
        let saved = ops.state;
        let rows = saved.input_rows;
        let need_wgrad = node_w.is_some() || !matches!(saved.wgrad, WgradTarget::Graph);
        let usage = Usage {
            rowwise: node_x.is_some(),
            columnwise: need_wgrad && saved.x_columnwise.is_some(),
        };
        let errors = saved.errors.clone();
        let device = Q::float_device(&dy);
        let zeros = |shape: [usize; 2], dtype: FloatDType| Q::float_zeros(shape.into(), &device, dtype);
        let fail = |grads: &mut Gradients, e: LowpError| {
            errors.record(e);
            for (node, shape, dtype) in [
                (&node_x, saved.x_shape, out_dtype),
                (&node_w, saved.w_shape, out_dtype),
                (&node_b, saved.bias_shape, saved.bias_dtype),
            ] {
                if let Some(node) = node {
                    grads.register::<Q>(node.id, zeros(shape, dtype));
                }
            }
        };
        // Under a debug session: the experts' token and weight rows, and dY before quantization
        // (the aligned batch: statistics read the layout's rows).
        let debug = saved.debug.as_ref().map(|d| {
            let rows_of = (
                ExpertsDebug::tokens(&saved.layout),
                d.weights(&saved.weight_groups, &saved.layout),
            );
            let aligned = match rows {
                InputRows::Aligned => dy.clone(),
                InputRows::Packed => move_rows(dy.clone(), &saved.layout, RowMove::Pad),
            };
            (d, rows_of, aligned)
        });
        // The biases' gradient; reading packed dY for it also gives FP8 current scaling its
        // per-group amaxes (one read of dY instead of two).
        let fuse_amax = rows == InputRows::Packed
            && matches!(saved.grad_output.spec, QuantizerSpec::Fp8Current { .. })
            && (usage.rowwise || usage.columnwise);
        let mut amax = None;
        if let Some(node) = &node_b {
            match Q::grouped_dbias_amax(dy.clone(), rows, &saved.layout, fuse_amax) {
                Ok((db, a)) => {
                    grads.register::<Q>(node.id, Q::float_cast(db, saved.bias_dtype));
                    amax = a;
                }
                Err(e) => return fail(grads, e),
            }
        }
        if !usage.rowwise && !usage.columnwise {
            return;
        }
        let qdy = match rows {
            InputRows::Aligned => saved.grad_output.quantize(dy, &saved.layout.groups, usage),
            InputRows::Packed => saved.grad_output.quantize_padded_with_amax(dy, &saved.layout, usage, amax),
        };
        let qdy = match qdy {
            Ok(q) => q,
            Err(e) => {
                // (The biases' gradient, if any, is already registered.)
                errors.record(e);
                for (node, shape) in [(&node_x, saved.x_shape), (&node_w, saved.w_shape)] {
                    if let Some(node) = node {
                        grads.register::<Q>(node.id, zeros(shape, out_dtype));
                    }
                }
                return;
            }
        };
        if let Some((d, (tokens, _), dy)) = &debug {
            let observed = d.layer.observe_experts(TensorKind::Gradient, dy, Some(&qdy), tokens);
            debug_or_warn(observed, "gradient statistics");
        }
        if let (Some(node), Some(w)) = (node_x, &saved.w_columnwise) {
            let dx = Q::grouped_gemm_unscaled(
                GemmKind::Dgrad,
                GroupedOperand {
                    tensor: &qdy,
                    groups: &saved.layout.groups,
                },
                GroupedOperand {
                    tensor: w,
                    groups: &saved.weight_groups,
                },
                GemmOptions {
                    out_dtype,
                    accumulate: None,
                    split_accumulator: Some(saved.split_accumulator.dgrad),
                    bias: None,
                },
            );
            let dx = match dx {
                Ok((dx, scales)) => match &debug {
                    Some((d, (tokens, _), _)) => {
                        let dx = finish_output(dx, scales, None, InputRows::Aligned, &saved.layout);
                        let observed =
                            d.layer.observe_experts::<Q>(TensorKind::Dgrad, &dx, None, tokens);
                        debug_or_warn(observed, "dgrad statistics");
                        finish_output(dx, None, None, rows, &saved.layout)
                    }
                    None => finish_output(dx, scales, None, rows, &saved.layout),
                },
                Err(e) => {
                    errors.record(e);
                    zeros(saved.x_shape, out_dtype)
                }
            };
            grads.register::<Q>(node.id, dx);
        }
        let Some(x) = saved.x_columnwise.filter(|_| usage.columnwise) else {
            return;
        };
        let pending = PendingWgrad {
            grad_output: qdy,
            input: x,
            groups: saved.layout.groups.clone(),
            out_dtype,
            split_accumulator: saved.split_accumulator.wgrad,
        };
        match saved.wgrad {
            WgradTarget::Graph => {
                if let Some(node) = node_w {
                    let dw = run_wgrad(&pending, None).unwrap_or_else(|e| {
                        errors.record(e);
                        zeros(saved.w_shape, out_dtype)
                    });
                    // (A weight gradient added to main_grad or deferred is not observed.)
                    if let Some((d, (_, weights), _)) = &debug {
                        let observed = d.layer.observe_experts::<Q>(TensorKind::Wgrad, &dw, None, weights);
                        debug_or_warn(observed, "wgrad statistics");
                    }
                    grads.register::<Q>(node.id, dw);
                }
            }
            WgradTarget::MainGrad {
                main_grad,
                overwrite,
            } => {
                let mut main = main_grad.lock().expect("main_grad lock");
                let accumulate = if overwrite { None } else { main.clone() };
                match run_wgrad(&pending, accumulate) {
                    Ok(dw) => *main = Some(Q::float_cast(dw, FloatDType::F32)),
                    Err(e) => errors.record(e),
                }
            }
            WgradTarget::Deferred(store) => store.lock().expect("wgrad store lock").push_back(pending),
        }
    }
}

/// The grouped linear op on a backend without autodiff: forward only.
pub(crate) fn grouped_linear_forward_only<Q: LowpBackend>(
    x: FloatTensor<Q>,
    input_rows: InputRows,
    w: FloatTensor<Q>,
    bias: Option<FloatTensor<Q>>,
    layout: &GroupLayout<Q>,
    op: GroupedLinearOp<Q>,
) -> Result<(FloatTensor<Q>, QuantizedTensor<Q>)> {
    let (y, _, qw) = grouped_forward(x, input_rows, w, bias, layout, &op, false, false)?;
    Ok((y, qw))
}

/// The grouped linear op on `Autodiff<B>`.
pub(crate) fn grouped_linear_autodiff<B: LowpBackend, C: CheckpointStrategy>(
    x: FloatTensor<Autodiff<B, C>>,
    input_rows: InputRows,
    w: FloatTensor<Autodiff<B, C>>,
    bias: Option<FloatTensor<Autodiff<B, C>>>,
    layout: &GroupLayout<B>,
    op: GroupedLinearOp<B>,
) -> Result<(FloatTensor<Autodiff<B, C>>, QuantizedTensor<B>)> {
    let need_dgrad = x.is_tracked();
    // The weight gradient is wanted when the weight is tracked, and always when it goes to a
    // main_grad buffer or the deferred store (whatever the weight's tracking).
    let need_wgrad = w.is_tracked() || !matches!(op.wgrad, WgradTarget::Graph);
    let (y, qx, qw) = grouped_forward(
        x.primitive.clone(),
        input_rows,
        w.primitive.clone(),
        bias.as_ref().map(|b| b.primitive.clone()),
        layout,
        &op,
        need_dgrad,
        need_wgrad,
    )?;
    let shape = |t: &FloatTensor<Autodiff<B, C>>| {
        let s = t.primitive.shape();
        [s[0], s[1]]
    };
    let (x_shape, w_shape) = (shape(&x), shape(&w));
    let (bias_shape, bias_dtype) = match &bias {
        Some(b) => (shape(b), gemm_dtype(b.primitive.dtype())),
        None => ([0, 0], FloatDType::F32),
    };
    let saved = |qx: QuantizedTensor<B>, qw: QuantizedTensor<B>| -> Result<GroupedSaved<B>> {
        Ok(GroupedSaved {
            x_columnwise: if need_wgrad {
                Some(columnwise_only(qx)?)
            } else {
                None
            },
            w_columnwise: if need_dgrad {
                Some(columnwise_only(qw)?)
            } else {
                None
            },
            input_rows,
            layout: layout.clone(),
            weight_groups: op.weight_groups.clone(),
            grad_output: op.grad_output.clone(),
            wgrad: op.wgrad.clone(),
            errors: op.errors.clone(),
            debug: op.debug.clone(),
            x_shape,
            w_shape,
            bias_shape,
            bias_dtype,
            split_accumulator: op.split_accumulator,
        })
    };
    let out = match bias {
        Some(bias) => match GroupedLinearBackward
            .prepare::<C>([x.node.clone(), w.node.clone(), bias.node.clone()])
            .compute_bound()
            .stateful()
        {
            OpsKind::Tracked(prep) => prep.finish(saved(qx, qw.clone())?, y),
            OpsKind::UnTracked(prep) => prep.finish(y),
        },
        None => match GroupedLinearBackward
            .prepare::<C>([x.node.clone(), w.node.clone()])
            .compute_bound()
            .stateful()
        {
            OpsKind::Tracked(prep) => prep.finish(saved(qx, qw.clone())?, y),
            OpsKind::UnTracked(prep) => prep.finish(y),
        },
    };
    Ok((out, qw))
}
