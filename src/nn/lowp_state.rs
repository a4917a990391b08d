//! What every burn-lowp module carries besides its parameters: the quantizers its recipe resolved
//! for each slot, delayed-scaling state when the recipe asks for it, the micro-batch weight cache
//! and counters (stochastic-rounding seeds, weight quantizations).

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use burn::module::Module;
use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorPrimitive};

use super::weight_cache::WeightCache;
use crate::error::Result;
use crate::backend::{Groups, ScaleColumns};
use crate::ops::{
    AmaxSink, BackwardErrors, DelayedSlot, GroupedDelayed, GroupedLinearOp, GroupedQuantizer,
    GroupedWeight, LinearOp, LowpLinear, OperandQuantizer, WeightOperand, WgradTarget,
};
use crate::debug::{LayerDebug, TensorKind};
use crate::quant::state_tensor::OptionalState;
use crate::quant::{DelayedScalingState, QuantizedTensor, QuantizerSpec};
use crate::format::grouped::GroupScaling;
use crate::recipe::{ModuleQuantizers, Pass, Recipe, SlotLayout};

/// Shared counters of a module (kept across clones; not saved).
#[derive(Debug, Default)]
pub struct Counters {
    /// Quantize calls so far, which seed stochastic rounding.
    pub calls: AtomicU64,
    /// Weight quantizations so far (a cached weight is not quantized again).
    pub weight_quantizations: AtomicUsize,
}

#[derive(Module, Debug)]
pub struct LowpState<B: Backend> {
    #[module(skip)]
    pub layout: SlotLayout,
    #[module(skip)]
    pub quantizers: ModuleQuantizers,
    pub delayed_forward: OptionalState<DelayedScalingState<B>>,
    pub delayed_backward: OptionalState<DelayedScalingState<B>>,
    pub cache: WeightCache<B>,
    #[module(skip)]
    pub counters: Arc<Counters>,
}

/// The amax sink of an operand whose (expert) slots are columns `first + g * stride` of
/// `state`'s history: casts read the history when they run; the tensor-op record covers
/// backends whose casts cannot write it.
fn amax_sink<B: LowpLinear>(
    state: &DelayedScalingState<B>,
    first: usize,
    stride: usize,
) -> AmaxSink<B::Quant> {
    let (now, record) = (state.clone(), state.clone());
    AmaxSink {
        history: Arc::new(move || B::to_quant(now.amax_history.value().into_primitive().tensor())),
        record: Arc::new(move |amax| {
            let amax: Tensor<B, 1> = Tensor::from_primitive(TensorPrimitive::Float(B::from_quant(amax)));
            match amax.dims()[0] {
                1 => record.record_amax(first, amax),
                groups => {
                    let slots: Vec<usize> = (0..groups).map(|g| first + g * stride).collect();
                    record.record_amaxes(&slots, amax)
                }
            }
        }),
        first,
        stride,
    }
}

/// The scales of slots `first + g * stride` of a module direction, read in place by the cast.
fn scale_columns<B: LowpLinear>(
    state: &DelayedScalingState<B>,
    first: usize,
    stride: usize,
) -> ScaleColumns<B::Quant> {
    ScaleColumns {
        scales: B::to_quant(state.scale.value().into_primitive().tensor()),
        first,
        stride,
    }
}

/// A seed base per module name, so that modules draw different stochastic-rounding streams.
fn name_seed(name: &str) -> u64 {
    name.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ b as u64).wrapping_mul(0x100_0000_01b3)
    })
}

impl<B: Backend> LowpState<B> {
    /// Resolves `recipe` for `layout` and checks each GEMM's `(out_features, in_features)`.
    pub fn new(
        recipe: &Recipe,
        layout: SlotLayout,
        features: &[(usize, usize)],
        device: &B::Device,
    ) -> Result<Self> {
        let quantizers = recipe.resolve(&layout)?;
        quantizers.check_gemm_shapes(&layout, features)?;
        let state = |slots| {
            quantizers
                .delayed
                .as_ref()
                .map(|c| DelayedScalingState::new(c, slots, device))
        };
        Ok(LowpState {
            delayed_forward: state(layout.forward.len()).into(),
            delayed_backward: state(layout.backward.len()).into(),
            layout,
            quantizers,
            cache: WeightCache::default(),
            counters: Arc::new(Counters::default()),
        })
    }

    /// Weight quantizations so far.
    pub fn weight_quantizations(&self) -> usize {
        self.counters.weight_quantizations.load(Ordering::Relaxed)
    }

    /// Quantize calls so far: the stochastic-rounding stream position, which a checkpoint saves
    /// so that a resumed run rounds exactly as the uninterrupted one.
    pub fn quantize_calls(&self) -> u64 {
        self.counters.calls.load(Ordering::Relaxed)
    }

    /// Restores the stochastic-rounding stream position saved by [`Self::quantize_calls`].
    pub fn set_quantize_calls(&self, calls: u64) {
        self.counters.calls.store(calls, Ordering::Relaxed);
    }
}

impl<B: LowpLinear> LowpState<B> {
    /// End of a training step (TE's autocast exit / first module's backward): delayed-scaling
    /// scales are recomputed from the amax histories, which roll (one launch per direction on
    /// CubeCL backends). A no-op for other recipes.
    pub fn end_step(&self) -> Result<()> {
        if let Some(config) = &self.quantizers.delayed {
            if let Some(state) = self.delayed_forward.as_ref() {
                state.update(config, config.fp8_format.element_format(true))?;
            }
            if let Some(state) = self.delayed_backward.as_ref() {
                state.update(config, config.fp8_format.element_format(false))?;
            }
        }
        Ok(())
    }

    fn operand(
        &self,
        pass: Pass,
        slot: usize,
        name: String,
        per_tensor_scaling: bool,
    ) -> OperandQuantizer<B::Quant> {
        let (quantizer, state) = match pass {
            Pass::Forward => (&self.quantizers.forward[slot], self.delayed_forward.as_ref()),
            Pass::Backward => (&self.quantizers.backward[slot], self.delayed_backward.as_ref()),
        };
        // The debug feature PerTensorScaling: a delayed-scaling slot takes its own amax instead.
        if let (true, QuantizerSpec::Fp8Delayed(config)) = (per_tensor_scaling, &quantizer.spec) {
            return OperandQuantizer {
                name,
                spec: QuantizerSpec::Fp8Current {
                    fp8: config.fp8_format.element_format(pass == Pass::Forward),
                    pow2_scales: false,
                    amax_epsilon: 0.0,
                },
                delayed: None,
                seed: 0,
            };
        }
        let delayed = match (&quantizer.spec, state) {
            (QuantizerSpec::Fp8Delayed(config), Some(state)) => Some(DelayedSlot {
                scale: scale_columns(state, slot, 1),
                fp8: config.fp8_format.element_format(pass == Pass::Forward),
                sink: amax_sink(state, slot, 1),
            }),
            _ => None,
        };
        OperandQuantizer {
            name,
            spec: quantizer.spec.clone(),
            delayed,
            seed: name_seed(&self.layout.name)
                .wrapping_add(self.counters.calls.fetch_add(1, Ordering::Relaxed)),
        }
    }

    /// The op of GEMM `gemm`: slots from the module's layout; the weight from the cache when
    /// `is_first_microbatch == Some(false)` and a cached copy exists.
    pub fn linear_op(
        &self,
        gemm: usize,
        is_first_microbatch: Option<bool>,
    ) -> Result<LinearOp<B::Quant>> {
        let cached = match is_first_microbatch {
            Some(false) => self.cache.get::<QuantizedTensor<B::Quant>>(),
            _ => None,
        };
        self.linear_op_with(gemm, cached)
    }

    /// The debug view of this module's GEMM `gemm` when a debug session on this thread selects
    /// the module (`debug::session`); LayerNormMLP's GEMMs are named `<name>.fc1` / `.fc2`.
    pub fn layer_debug(&self, gemm: usize) -> Result<Option<LayerDebug>> {
        let debug = LayerDebug::for_layer(&self.layout.name, &self.layout.kind)?;
        Ok(debug.map(|d| match self.layout.kind {
            crate::recipe::ModuleKind::LayerNormMlp => {
                d.sublayer(format!("{}.fc{}", self.layout.name, gemm + 1))
            }
            _ => d,
        }))
    }

    /// The op of GEMM `gemm` with its weight from `cached` when given (modules with several
    /// weights keep their own cache entry), else quantized in the call.
    pub fn linear_op_with(
        &self,
        gemm: usize,
        cached: Option<QuantizedTensor<B::Quant>>,
    ) -> Result<LinearOp<B::Quant>> {
        let debug = self.layer_debug(gemm)?;
        Ok(self.linear_op_debug(gemm, cached, debug))
    }

    /// `linear_op_with` under a given debug view (a grouped layer's experts name their own).
    pub fn linear_op_debug(
        &self,
        gemm: usize,
        cached: Option<QuantizedTensor<B::Quant>>,
        debug: Option<LayerDebug>,
    ) -> LinearOp<B::Quant> {
        let pts = |t| debug.as_ref().is_some_and(|d| d.per_tensor_scaling(t));
        let slots = self.layout.gemms()[gemm];
        let prefix = if self.layout.kind == crate::recipe::ModuleKind::LayerNormMlp {
            format!("{} fc{}", self.layout.name, gemm + 1)
        } else {
            self.layout.name.clone()
        };
        let name = |what: &str| format!("{prefix} {what}");
        let weight = match cached {
            Some(q) => WeightOperand::Cached(q),
            None => {
                self.counters
                    .weight_quantizations
                    .fetch_add(1, Ordering::Relaxed);
                WeightOperand::Quantize(self.operand(
                    Pass::Forward,
                    slots.weight,
                    name("weight"),
                    pts(TensorKind::Weight),
                ))
            }
        };
        LinearOp {
            input: self.operand(
                Pass::Forward,
                slots.input,
                name("input"),
                pts(TensorKind::Activation),
            ),
            weight,
            grad_output: self.operand(
                Pass::Backward,
                slots.grad_output,
                name("grad_output"),
                pts(TensorKind::Gradient),
            ),
            debug,
            split_accumulator: self.quantizers.split_accumulator,
        }
    }

    /// Keeps the weight quantized in this call for the next micro-batches (`Some(true)`).
    pub fn keep_weight(
        &self,
        weight: QuantizedTensor<B::Quant>,
        is_first_microbatch: Option<bool>,
    ) {
        if is_first_microbatch == Some(true) {
            self.cache.set(weight);
        }
    }

    /// The quantizer of one tensor of every expert of a grouped module: `slots[g]` is expert g's
    /// slot (all share one role, so one spec); with delayed scaling, the experts' scales are
    /// gathered and their amaxes recorded in one go. Group g rounds with seed `seed + g`, so the
    /// call counter advances by the number of groups.
    fn grouped_quantizer(
        &self,
        pass: Pass,
        slots: Vec<usize>,
        name: String,
        scaling: GroupScaling,
    ) -> GroupedQuantizer<B::Quant> {
        let (quantizer, state) = match pass {
            Pass::Forward => (&self.quantizers.forward[slots[0]], self.delayed_forward.as_ref()),
            Pass::Backward => (&self.quantizers.backward[slots[0]], self.delayed_backward.as_ref()),
        };
        let delayed = match (&quantizer.spec, state) {
            (QuantizerSpec::Fp8Delayed(config), Some(state)) => {
                // The layout gives an operand's expert slots at a fixed stride (`gemms`), which
                // the casts read and record by (an invariant of `SlotLayout`, checked: a wrong
                // column would be a silently wrong scale).
                let stride = if slots.len() > 1 { slots[1] - slots[0] } else { 1 };
                assert!(
                    slots.iter().enumerate().all(|(g, &s)| s == slots[0] + g * stride),
                    "expert slots {slots:?} are not evenly spaced"
                );
                Some(GroupedDelayed {
                    scales: scale_columns(state, slots[0], stride),
                    fp8: config.fp8_format.element_format(pass == Pass::Forward),
                    sink: amax_sink(state, slots[0], stride),
                })
            }
            _ => None,
        };
        let groups = self.layout.gemms().len() as u64;
        GroupedQuantizer {
            name,
            spec: quantizer.spec.clone(),
            delayed,
            seed: name_seed(&self.layout.name)
                .wrapping_add(self.counters.calls.fetch_add(groups, Ordering::Relaxed)),
            scaling,
        }
    }

    /// The grouped linear op of a grouped module (one GEMM per expert): inputs, stacked weights
    /// (cached as `linear_op` does) and gradients, each quantized per expert (FP8 per-tensor
    /// scales per expert or shared, as `scaling` says).
    pub fn grouped_linear_op(
        &self,
        is_first_microbatch: Option<bool>,
        weight_groups: Groups<B::Quant>,
        wgrad: WgradTarget<B::Quant>,
        errors: BackwardErrors,
        scaling: GroupScaling,
    ) -> GroupedLinearOp<B::Quant> {
        let gemms = self.layout.gemms();
        let slots = |f: fn(&crate::recipe::GemmSlots) -> usize| gemms.iter().map(f).collect();
        let name = |what: &str| format!("{} {what}", self.layout.name);
        let cached = match is_first_microbatch {
            Some(false) => self.cache.get::<QuantizedTensor<B::Quant>>(),
            _ => None,
        };
        let weight = match cached {
            Some(q) => GroupedWeight::Cached(q),
            None => {
                self.counters
                    .weight_quantizations
                    .fetch_add(1, Ordering::Relaxed);
                GroupedWeight::Quantize(self.grouped_quantizer(
                    Pass::Forward,
                    slots(|g| g.weight),
                    name("weight"),
                    scaling,
                ))
            }
        };
        GroupedLinearOp {
            input: self.grouped_quantizer(
                Pass::Forward,
                slots(|g| g.input),
                name("input"),
                scaling,
            ),
            weight,
            grad_output: self.grouped_quantizer(
                Pass::Backward,
                slots(|g| g.grad_output),
                name("grad_output"),
                scaling,
            ),
            weight_groups,
            wgrad,
            errors,
            split_accumulator: self.quantizers.split_accumulator,
            debug: None,
        }
    }
}
