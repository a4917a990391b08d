//! LayerNormMLP as one differentiable op: `norm -> fc1 (+ b1) -> activation -> fc2 (+ b2)`, TE's
//! `_LayerNormMLP` (spec section 10), every GEMM quantized as its slot says.
//!
//! Forward: the norm pass writes `ln_out` and, for an FP8 current-scaling fc1 input, its amax;
//! fc1's input is quantized from it (rowwise, plus columnwise for fc1's wgrad) without an amax
//! pass. fc2's input under FP8 delayed scaling is the activation quantized in the cast itself
//! (`OperandQuantizer::quantize_activation`: the activation's output is never in memory);
//! otherwise the activation pass writes it with its amax, then its quantizer runs. Saved for
//! backward: x, mean, rstd and γ (norm backward), the fc1 output `h` (activation backward), and
//! the quantized columnwise copies of ln_out, the activation and both weights, never their
//! high-precision originals.
//!
//! Backward, in TE's order: dbias2 (+ the amax of dY for fc2's grad_output quantizer), fc2
//! dgrad, fc2 wgrad, activation backward (+ dbias1, + the amax of dh for fc1's grad_output
//! quantizer), fc1 dgrad, fc1 wgrad, norm backward. With `delay_wgrad_compute` the two wgrad
//! GEMMs are kept (quantized operands only) for
//! `LayerNormMlp::backward_dw`.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::Autodiff;
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::ops::FloatTensor;
use burn::tensor::{FloatDType, Shape, TensorMetadata};

use crate::backend::activation::ActivationSpec;
use super::linear::{
    columnwise_only, debugged_dgrad_and_wgrad, dgrad_and_wgrad, fprop, DebugSaved, LinearOp,
};
use super::lowp_linear::gemm_dtype;
use super::operand::{quantize_weight, OperandQuantizer};
use crate::recipe::SplitAccumulator;
use crate::backend::{float_dtype, GemmKind, GemmOptions, LowpBackend, NormSpec};
use crate::error::{LowpError, Result};
use crate::format::Usage;
use crate::quant::QuantizedTensor;

/// The op's tensors. `gamma` and `beta` are the norm's (absent when the caller normalized x
/// itself, `MlpOp::norm == None`); the rest are fc1's and fc2's weights `[out, in]` and biases.
#[derive(Clone, Debug)]
pub struct MlpInputs<T> {
    pub x: T,
    pub gamma: Option<T>,
    pub beta: Option<T>,
    pub w1: T,
    pub b1: Option<T>,
    pub w2: T,
    pub b2: Option<T>,
}

/// A weight gradient kept for `backward_dw`: `dW = dYᵀ · X` of GEMM `gemm` (0 = fc1, 1 = fc2).
#[derive(Clone, Debug)]
pub struct PendingMlpWgrad<Q: LowpBackend> {
    pub gemm: usize,
    pub grad_output: QuantizedTensor<Q>,
    pub input: QuantizedTensor<Q>,
    pub out_dtype: FloatDType,
    /// The wgrad's FP8 accumulation (`GemmOptions::split_accumulator`).
    pub split_accumulator: bool,
}

impl<Q: LowpBackend> PendingMlpWgrad<Q> {
    pub fn run(&self) -> Result<FloatTensor<Q>> {
        Q::gemm_quantized(
            GemmKind::Wgrad,
            &self.grad_output,
            &self.input,
            GemmOptions {
                out_dtype: self.out_dtype,
                accumulate: None,
                split_accumulator: Some(self.split_accumulator),
                bias: None,
            },
        )
    }
}

/// Where the wgrad GEMMs' results go.
#[derive(Clone, Debug)]
pub enum MlpWgrad<Q: LowpBackend> {
    Graph,
    Deferred(Arc<Mutex<VecDeque<PendingMlpWgrad<Q>>>>),
}

/// Everything the op needs besides its tensors.
#[derive(Clone, Debug)]
pub struct MlpOp<Q: LowpBackend> {
    /// The norm to apply to x; `None` when x is already normalized.
    pub norm: Option<NormSpec>,
    pub activation: ActivationSpec,
    pub fc1: LinearOp<Q>,
    pub fc2: LinearOp<Q>,
    pub wgrad: MlpWgrad<Q>,
}

/// Which gradients backward will produce (the forward keeps only what they need).
#[derive(Clone, Copy, Debug, Default)]
struct Needs {
    /// dx, dγ or dβ: the gradient of ln_out (fc1 dgrad) and the norm backward.
    below_fc1: bool,
    /// dW1 (or a deferred fc1 wgrad).
    w1: bool,
    /// anything below fc2: dh, hence the activation backward.
    below_fc2: bool,
    /// dW2 (or a deferred fc2 wgrad).
    w2: bool,
}

/// What backward reads.
#[derive(Clone, Debug)]
struct MlpSaved<Q: LowpBackend> {
    norm: Option<(NormSpec, FloatTensor<Q>, FloatTensor<Q>, FloatTensor<Q>, FloatTensor<Q>)>,
    has_beta: bool,
    ln_columnwise: Option<QuantizedTensor<Q>>,
    w1_columnwise: Option<QuantizedTensor<Q>>,
    h: Option<FloatTensor<Q>>,
    a_columnwise: Option<QuantizedTensor<Q>>,
    w2_columnwise: Option<QuantizedTensor<Q>>,
    activation: ActivationSpec,
    fc1_grad_output: OperandQuantizer<Q>,
    fc2_grad_output: OperandQuantizer<Q>,
    wgrad: MlpWgrad<Q>,
    param_dtype: FloatDType,
    norm_dtype: FloatDType,
    fc1_debug: Option<DebugSaved<Q>>,
    fc2_debug: Option<DebugSaved<Q>>,
    /// fc1's and fc2's FP8 accumulation.
    split_accumulator: [SplitAccumulator; 2],
}

/// A GEMM's debug view for backward, with the originals its backward GEMMs may run on.
fn debug_saved<Q: LowpBackend>(
    op: &LinearOp<Q>,
    x: Option<FloatTensor<Q>>,
    w: Option<FloatTensor<Q>>,
    need_wgrad: bool,
    need_dgrad: bool,
) -> Option<DebugSaved<Q>> {
    op.debug.clone().map(|debug| {
        let keep = debug.keeps_originals();
        DebugSaved {
            x: x.filter(|_| keep && need_wgrad),
            w: w.filter(|_| keep && need_dgrad),
            debug,
        }
    })
}

fn dims2(t: &impl TensorMetadata, what: &str) -> Result<[usize; 2]> {
    let s = t.shape().as_slice().to_vec();
    match s.as_slice() {
        [a, b] => Ok([*a, *b]),
        _ => Err(LowpError::shape(what, format!("{s:?}"), "must be a matrix")),
    }
}

struct MlpForward<Q: LowpBackend> {
    out: FloatTensor<Q>,
    saved: MlpSaved<Q>,
    w1: QuantizedTensor<Q>,
    w2: QuantizedTensor<Q>,
}

/// The forward pass on the inner backend, keeping what `needs` asks backward to have.
fn forward<Q: LowpBackend>(
    inputs: MlpInputs<FloatTensor<Q>>,
    op: &MlpOp<Q>,
    needs: Needs,
) -> Result<MlpForward<Q>> {
    let [rows, hidden] = dims2(&inputs.x, "layernorm_mlp input")?;
    let [fc1_out, fc1_in] = dims2(&inputs.w1, "fc1 weight")?;
    let [fc2_out, fc2_in] = dims2(&inputs.w2, "fc2 weight")?;
    let ffn = if op.activation.activation.is_gated() {
        fc1_out / 2
    } else {
        fc1_out
    };
    if fc1_in != hidden || fc2_in != ffn || fc2_out != hidden {
        return Err(LowpError::shape(
            "layernorm_mlp weights",
            format!("x [{rows}, {hidden}], fc1 [{fc1_out}, {fc1_in}], fc2 [{fc2_out}, {fc2_in}]"),
            format!(
                "fc1 is [{}F, hidden] and fc2 [hidden, F] for {}",
                if op.activation.activation.is_gated() { 2 } else { 1 },
                op.activation.activation
            ),
        ));
    }
    if needs.below_fc2 || needs.w2 {
        // The gradients' shapes must suit their quantizers: say so now, not inside backward.
        op.fc2
            .grad_output
            .spec
            .check_shape(&op.fc2.grad_output.name, rows, hidden)?;
        op.fc1
            .grad_output
            .spec
            .check_shape(&op.fc1.grad_output.name, rows, fc1_out)?;
    }
    let out_dtype = gemm_dtype(inputs.x.dtype());
    let param_dtype = float_dtype(inputs.w1.dtype());
    // Each fprop adds its bias in the GEMM (cuBLASLt's epilogue on CUDA).
    let options = |linear: &LinearOp<Q>, bias: Option<FloatTensor<Q>>| GemmOptions {
        out_dtype,
        accumulate: None,
        split_accumulator: Some(linear.split_accumulator.fprop),
        bias: bias.map(|b| Q::float_cast(b, out_dtype)),
    };
    let has_beta = inputs.beta.is_some();
    let norm_dtype = inputs
        .gamma
        .as_ref()
        .map_or(param_dtype, |g| float_dtype(g.dtype()));

    // Norm (+ the amax fc1's input quantizer would otherwise take in a pass of its own).
    let (ln_out, ln_amax, norm) = match (&op.norm, inputs.gamma) {
        (Some(spec), Some(gamma)) => {
            let gamma = Q::float_cast(gamma, float_dtype(inputs.x.dtype()));
            let beta = inputs
                .beta
                .map(|b| Q::float_cast(b, float_dtype(inputs.x.dtype())));
            let r = Q::norm_forward(
                inputs.x.clone(),
                gamma.clone(),
                beta,
                spec,
                op.fc1.input.takes_amax(),
            )?;
            let keep = needs
                .below_fc1
                .then(|| (*spec, inputs.x, gamma, r.mean, r.rstd));
            (r.y, r.amax, keep)
        }
        (None, _) => (inputs.x, None, None),
        (Some(_), None) => {
            return Err(LowpError::invalid(
                "layernorm_mlp",
                "a norm without its weight",
                "the norm needs γ",
            ))
        }
    };

    // fc1.
    // Under a debug view the GEMMs see the high-precision inputs too (`fprop`).
    let ln_original = op.fc1.debug.as_ref().map(|_| ln_out.clone());
    let w1_original = op.fc1.debug.as_ref().map(|_| inputs.w1.clone());
    let q_ln = op.fc1.input.quantize_with_amax(
        ln_out,
        ln_amax,
        Usage {
            rowwise: true,
            columnwise: needs.w1,
        },
    )?;
    let q_w1 = quantize_weight(&op.fc1.weight, inputs.w1, needs.below_fc1)?;
    let h = fprop(
        op.fc1.debug.as_ref(),
        ln_original.as_ref().zip(w1_original.as_ref()),
        &q_ln,
        &q_w1,
        options(&op.fc1, inputs.b1),
    )?;

    // Activation and fc2's input: in one pass where the backend fuses the activation into the
    // FP8 cast (delayed scaling: the activation's output never in memory); else the activation
    // (+ the amax of fc2's input), then the quantizer. A debug view needs the activation itself.
    let a_usage = Usage {
        rowwise: true,
        columnwise: needs.w2,
    };
    let fused = match op.fc2.debug {
        None => op.fc2.input.quantize_activation(h.clone(), &op.activation, a_usage)?,
        Some(_) => None,
    };
    let (q_a, a_original) = match fused {
        Some(q_a) => (q_a, None),
        None => {
            let act =
                Q::act_forward(h.clone(), &op.activation, op.fc2.input.takes_amax())?;
            let a_original = op.fc2.debug.as_ref().map(|_| act.y.clone());
            let q_a = op.fc2.input.quantize_with_amax(act.y, act.amax, a_usage)?;
            (q_a, a_original)
        }
    };
    let w2_original = op.fc2.debug.as_ref().map(|_| inputs.w2.clone());
    let q_w2 = quantize_weight(&op.fc2.weight, inputs.w2, needs.below_fc2)?;
    let out = fprop(
        op.fc2.debug.as_ref(),
        a_original.as_ref().zip(w2_original.as_ref()),
        &q_a,
        &q_w2,
        options(&op.fc2, inputs.b2),
    )?;

    let saved = MlpSaved {
        norm,
        has_beta,
        ln_columnwise: needs.w1.then(|| columnwise_only(q_ln)).transpose()?,
        w1_columnwise: needs
            .below_fc1
            .then(|| columnwise_only(q_w1.clone()))
            .transpose()?,
        h: needs.below_fc2.then_some(h),
        a_columnwise: needs.w2.then(|| columnwise_only(q_a)).transpose()?,
        w2_columnwise: needs
            .below_fc2
            .then(|| columnwise_only(q_w2.clone()))
            .transpose()?,
        activation: op.activation,
        fc1_grad_output: op.fc1.grad_output.clone(),
        fc2_grad_output: op.fc2.grad_output.clone(),
        fc1_debug: debug_saved(&op.fc1, ln_original, w1_original, needs.w1, needs.below_fc1),
        fc2_debug: debug_saved(&op.fc2, a_original, w2_original, needs.w2, needs.below_fc2),
        wgrad: op.wgrad.clone(),
        split_accumulator: [op.fc1.split_accumulator, op.fc2.split_accumulator],
        param_dtype,
        norm_dtype,
    };
    Ok(MlpForward {
        out,
        saved,
        w1: q_w1,
        w2: q_w2,
    })
}

/// Forward without autodiff (inference backends): returns the output and the quantized weights.
pub(crate) fn layernorm_mlp_forward_only<Q: LowpBackend>(
    inputs: MlpInputs<FloatTensor<Q>>,
    op: MlpOp<Q>,
) -> Result<(FloatTensor<Q>, QuantizedTensor<Q>, QuantizedTensor<Q>)> {
    let f = forward(inputs, &op, Needs::default())?;
    Ok((f.out, f.w1, f.w2))
}

#[derive(Debug)]
struct LayerNormMlpBackward;

/// The parents, in this order.
const X: usize = 0;
const GAMMA: usize = 1;
const BETA: usize = 2;
const W1: usize = 3;
const B1: usize = 4;
const W2: usize = 5;
const B2: usize = 6;

impl<Q: LowpBackend> Backward<Q, 7> for LayerNormMlpBackward {
    type State = MlpSaved<Q>;

    fn backward(
        self,
        ops: Ops<Self::State, 7>,
        grads: &mut Gradients,
        _checkpointer: &mut Checkpointer,
    ) {
        let dy = grads.consume::<Q>(&ops.node);
        let p = &ops.parents;
        let saved = ops.state;
        let deferred = match &saved.wgrad {
            MlpWgrad::Deferred(store) => Some(store.clone()),
            MlpWgrad::Graph => None,
        };
        let below_fc1 = p[X].is_some() || p[GAMMA].is_some() || p[BETA].is_some();
        let below_act = below_fc1 || p[W1].is_some();
        let below_fc2 = below_act || p[B1].is_some();
        let out_dtype = gemm_dtype(dy.dtype());
        // A GEMM's dgrad (when `weight` is given) and wgrad (when `input` is), as one group; a
        // deferred wgrad is kept for `backward_dw` instead.
        let gemms = |gemm: usize,
                     grad_output: &QuantizedTensor<Q>,
                     grad_original: &FloatTensor<Q>,
                     weight: Option<&QuantizedTensor<Q>>,
                     input: Option<&QuantizedTensor<Q>>| {
            let debug = [&saved.fc1_debug, &saved.fc2_debug][gemm].as_ref();
            let split = saved.split_accumulator[gemm];
            let input = match (&deferred, input) {
                (Some(store), Some(input)) => {
                    store
                        .lock()
                        .expect("wgrad store lock")
                        .push_back(PendingMlpWgrad {
                            gemm,
                            grad_output: grad_output.clone(),
                            input: input.clone(),
                            out_dtype,
                            split_accumulator: split.wgrad,
                        });
                    None
                }
                (_, input) => input,
            };
            match debug {
                Some(debug) => debugged_dgrad_and_wgrad::<Q>(
                    debug,
                    grad_original,
                    grad_output,
                    weight,
                    input,
                    out_dtype,
                    split,
                ),
                None => dgrad_and_wgrad::<Q>(
                    weight.map(|w| (grad_output, w)),
                    input.map(|x| (grad_output, x)),
                    out_dtype,
                    split,
                ),
            }
        };

        // dbias2 and, where fused, dY's amax for its FP8 current-scaling cast, in one read of dY
        // (as `Linear`).
        let dy_amax = match &p[B2] {
            Some(node) => {
                let (db2, amax) =
                    Q::act_dbias_amax(dy.clone()).expect("dbias of dY [rows, hidden]");
                grads.register::<Q>(node.id, Q::float_cast(db2, saved.param_dtype));
                amax
            }
            None => None,
        };
        let want_w2 = saved.a_columnwise.is_some();
        let q_dy = saved
            .fc2_grad_output
            .quantize_with_amax(
                dy.clone(),
                dy_amax,
                Usage {
                    rowwise: below_fc2,
                    columnwise: want_w2,
                },
            )
            .expect("quantize fc2 grad_output");
        let w2 = below_fc2.then(|| saved.w2_columnwise.as_ref().expect("fc2 weight saved"));
        let (da, dw2) = gemms(1, &q_dy, &dy, w2, saved.a_columnwise.as_ref());
        if let (Some(node), Some(dw2)) = (&p[W2], dw2) {
            grads.register::<Q>(node.id, Q::float_cast(dw2, saved.param_dtype));
        }
        let Some(da) = da else {
            return;
        };
        drop(q_dy);
        let h = saved.h.clone().expect("fc1 output saved");
        let act = Q::act_backward(
            da,
            h,
            &saved.activation,
            below_act && saved.fc1_grad_output.takes_amax(),
            p[B1].is_some(),
        )
        .expect("activation backward");
        if let (Some(node), Some(db1)) = (&p[B1], act.dbias) {
            grads.register::<Q>(node.id, Q::float_cast(db1, saved.param_dtype));
        }
        if !below_act {
            return;
        }
        let want_w1 = saved.ln_columnwise.is_some();
        let q_dh = saved
            .fc1_grad_output
            .quantize_with_amax(
                act.y.clone(),
                act.amax,
                Usage {
                    rowwise: below_fc1,
                    columnwise: want_w1,
                },
            )
            .expect("quantize fc1 grad_output");
        let w1 = below_fc1.then(|| saved.w1_columnwise.as_ref().expect("fc1 weight saved"));
        let (dln, dw1) = gemms(0, &q_dh, &act.y, w1, saved.ln_columnwise.as_ref());
        if let (Some(node), Some(dw1)) = (&p[W1], dw1) {
            grads.register::<Q>(node.id, Q::float_cast(dw1, saved.param_dtype));
        }
        let Some(dln) = dln else {
            return;
        };
        match saved.norm {
            None => {
                if let Some(node) = &p[X] {
                    grads.register::<Q>(node.id, dln);
                }
            }
            Some((spec, x, gamma, mean, rstd)) => {
                let x_dtype = x.dtype();
                let dln = Q::float_cast(dln, float_dtype(x_dtype));
                let nb = Q::norm_backward(dln, x, gamma, mean, rstd, &spec, saved.has_beta)
                    .expect("norm backward");
                if let Some(node) = &p[X] {
                    grads.register::<Q>(node.id, nb.dx);
                }
                if let Some(node) = &p[GAMMA] {
                    grads.register::<Q>(node.id, Q::float_cast(nb.dgamma, saved.norm_dtype));
                }
                if let (Some(node), Some(dbeta)) = (&p[BETA], nb.dbeta) {
                    grads.register::<Q>(node.id, Q::float_cast(dbeta, saved.norm_dtype));
                }
            }
        }
    }
}

/// The op on `Autodiff<B>`: forward on the inner backend, keeping what the tracked inputs'
/// gradients need. Absent inputs (no β, no biases, no norm) take an untracked placeholder.
pub(crate) fn layernorm_mlp_autodiff<B: LowpBackend, C: CheckpointStrategy>(
    inputs: MlpInputs<FloatTensor<Autodiff<B, C>>>,
    op: MlpOp<B>,
) -> Result<(FloatTensor<Autodiff<B, C>>, QuantizedTensor<B>, QuantizedTensor<B>)> {
    type A<B, C> = Autodiff<B, C>;
    let tracked = |t: &Option<FloatTensor<A<B, C>>>| t.as_ref().is_some_and(|t| t.is_tracked());
    let deferred = matches!(op.wgrad, MlpWgrad::Deferred(_));
    let needs = Needs {
        below_fc1: inputs.x.is_tracked() || tracked(&inputs.gamma) || tracked(&inputs.beta),
        w1: inputs.w1.is_tracked() || deferred,
        below_fc2: inputs.x.is_tracked()
            || tracked(&inputs.gamma)
            || tracked(&inputs.beta)
            || inputs.w1.is_tracked()
            || tracked(&inputs.b1),
        w2: inputs.w2.is_tracked() || deferred,
    };
    let placeholder = || {
        <A<B, C> as AutodiffBackend>::from_inner(B::float_zeros(
            Shape::new([1]),
            &B::float_device(&inputs.x.primitive),
            FloatDType::F32,
        ))
    };
    let node = |t: &Option<FloatTensor<A<B, C>>>| {
        t.clone().unwrap_or_else(placeholder).node.clone()
    };
    let nodes = [
        inputs.x.node.clone(),
        node(&inputs.gamma),
        node(&inputs.beta),
        inputs.w1.node.clone(),
        node(&inputs.b1),
        inputs.w2.node.clone(),
        node(&inputs.b2),
    ];
    let inner = |t: FloatTensor<A<B, C>>| t.primitive;
    let f = forward(
        MlpInputs {
            x: inner(inputs.x),
            gamma: inputs.gamma.map(inner),
            beta: inputs.beta.map(inner),
            w1: inner(inputs.w1),
            b1: inputs.b1.map(inner),
            w2: inner(inputs.w2),
            b2: inputs.b2.map(inner),
        },
        &op,
        needs,
    )?;
    let out = match LayerNormMlpBackward
        .prepare::<C>(nodes)
        .compute_bound()
        .stateful()
    {
        OpsKind::Tracked(prep) => prep.finish(f.saved, f.out),
        OpsKind::UnTracked(prep) => prep.finish(f.out),
    };
    Ok((out, f.w1, f.w2))
}
