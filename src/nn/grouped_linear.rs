//! `GroupedLinear`: the experts of an MoE layer, `y_t = x_t · W_gᵀ + b_g` for every token t that the
//! router sent to expert g (TE's `GroupedLinear`). The token batch `x [T, in]` holds the experts'
//! tokens one expert after another, `m_splits` (an Int tensor on the device) says how many each;
//! nothing reads the splits on the host before the GEMMs that need them (see `backend::grouped`).
//!
//! The weights are one parameter `[E, out, in]` (`expert_weight(g)` views one), the biases
//! `[E, out]`. Inside, tokens move to the aligned layout the grouped GEMMs take (each expert's
//! rows start at a multiple of 128, zero padding) and back: `forward` does both moves,
//! `forward_aligned` takes a batch already laid out (the MoE layer's `dispatch` produces it).
//!
//! Micro-batches: `forward_microbatch(x, m_splits, Some(true))` quantizes the stacked weights and
//! caches them, `Some(false)` reuses them (as `Linear`). `delay_wgrad_compute` keeps each weight
//! gradient's operands and computes them in `backward_dw` (TE's pipeline-parallel split);
//! `fuse_wgrad_accumulation` accumulates the weight gradient in f32 into a `main_grad` buffer
//! instead of the autodiff graph (overwritten on the first micro-batch, `Some(true)`). The buffer
//! and the deferred store live until the module's parameters change (an optimizer step), which
//! is when a training loop has consumed them.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use burn::config::Config;
use burn::module::{Module, Param};
use burn::optim::GradientsParams;
use burn::tensor::backend::Backend;
use burn::tensor::ops::{FloatTensor, FloatTensorOps, IntTensor};
use burn::tensor::{Distribution, Int, Tensor, TensorData, TensorPrimitive};

use super::lowp_state::LowpState;
use super::weight_cache::WeightCache;
use crate::backend::grouped::check_splits_shape;
use crate::backend::{GroupLayout, Groups, LowpBackend};
use crate::error::LowpError;

type LowpResult<T> = std::result::Result<T, LowpError>;
use crate::debug::LayerDebug;
use crate::format::grouped::{uniform_groups, GroupScaling, GROUP_ALIGN};
use crate::ops::grouped_linear::{run_wgrad, ExpertsDebug};
use crate::ops::{grad_tap, BackwardErrors, InputRows, LowpLinear, PendingWgrad, RowMove, WgradTarget};
use crate::recipe::{BoundaryRoles, ModuleKind, Recipe, SlotLayout};

#[derive(Config, Debug)]
pub struct GroupedLinearConfig {
    /// Experts (TE's `num_gemms`).
    pub num_gemms: usize,
    pub in_features: usize,
    /// Each expert's output features: a multiple of 128 (the experts' weights are one grouped
    /// matrix whose groups are whole 128-row GEMM chunks).
    pub out_features: usize,
    #[config(default = true)]
    pub bias: bool,
    /// The module's name in quantizer roles (recipes can match it).
    #[config(default = "String::new()")]
    pub name: String,
    /// Weights are drawn from N(0, init_std) (TE's default 0.023); biases start at 0.
    #[config(default = 0.023)]
    pub init_std: f64,
    /// Keep the weight gradients' operands for `backward_dw` instead of computing them in
    /// backward (TE's `delay_wgrad_compute`).
    #[config(default = false)]
    pub delay_wgrad_compute: bool,
    /// Accumulate the weight gradient in f32 into `main_grad` instead of the autodiff graph
    /// (TE's `fuse_wgrad_accumulation`).
    #[config(default = false)]
    pub fuse_wgrad_accumulation: bool,
    /// FP8 per-tensor scales (current and delayed scaling): one per expert (`per_group`, TE's
    /// semantics), or one shared by all experts (`shared`), which the grouped GEMMs apply inside
    /// cuBLASLt instead of a pass over their output (`format::grouped::GroupScaling`). Other
    /// formats ignore it.
    #[config(default = "GroupScaling::PerGroup")]
    pub fp8_scales: GroupScaling,
}

#[derive(Module, Debug)]
pub struct GroupedLinear<B: Backend> {
    /// `[experts, out_features, in_features]`.
    pub weight: Param<Tensor<B, 3>>,
    /// `[experts, out_features]`.
    pub bias: Option<Param<Tensor<B, 2>>>,
    pub lowp: LowpState<B>,
    /// The weights' groups, the deferred-wgrad store and `main_grad` (`GroupedRuntime`); emptied
    /// when the parameters change, like the weight cache.
    runtime: WeightCache<B>,
    #[module(skip)]
    delay_wgrad_compute: bool,
    #[module(skip)]
    fuse_wgrad_accumulation: bool,
    #[module(skip)]
    fp8_scales: GroupScaling,
}

/// What a `GroupedLinear` keeps between calls besides its weight cache.
struct GroupedRuntime<Q: LowpBackend> {
    weight_groups: Groups<Q>,
    /// The expert of each row of the stacked weights (for the debug tools' statistics).
    weight_labels: IntTensor<Q>,
    pending: Arc<Mutex<VecDeque<PendingWgrad<Q>>>>,
    main_grad: Arc<Mutex<Option<FloatTensor<Q>>>>,
    errors: BackwardErrors,
}

impl GroupedLinearConfig {
    pub fn init<B: Backend>(&self, recipe: &Recipe, device: &B::Device) -> LowpResult<GroupedLinear<B>> {
        self.init_with(recipe, &BoundaryRoles::default(), device)
    }

    /// As `init`, with the roles a parent gives the output and grad_input slots.
    pub fn init_with<B: Backend>(
        &self,
        recipe: &Recipe,
        boundary: &BoundaryRoles,
        device: &B::Device,
    ) -> LowpResult<GroupedLinear<B>> {
        let module = if self.name.is_empty() {
            "grouped_linear".to_string()
        } else {
            self.name.clone()
        };
        if self.num_gemms == 0 {
            return Err(LowpError::invalid(
                format!("{module} num_gemms"),
                0,
                "a grouped linear has at least one expert",
            ));
        }
        if self.out_features == 0 || self.out_features % GROUP_ALIGN != 0 {
            return Err(LowpError::invalid(
                format!("{module} out_features"),
                self.out_features,
                format!(
                    "must be a positive multiple of {GROUP_ALIGN}: the experts' weights are one \
                     grouped matrix of whole {GROUP_ALIGN}-row chunks"
                ),
            ));
        }
        if self.in_features == 0 {
            return Err(LowpError::invalid(
                format!("{module} in_features"),
                0,
                "must be positive",
            ));
        }
        let layout = SlotLayout::new(
            ModuleKind::GroupedLinear {
                num_gemms: self.num_gemms,
            },
            &self.name,
            boundary,
        );
        let lowp = LowpState::new(
            recipe,
            layout,
            &vec![(self.out_features, self.in_features); self.num_gemms],
            device,
        )?;
        let weight = Tensor::random(
            [self.num_gemms, self.out_features, self.in_features],
            Distribution::Normal(0.0, self.init_std),
            device,
        );
        Ok(GroupedLinear {
            weight: Param::from_tensor(weight),
            bias: self.bias.then(|| {
                Param::from_tensor(Tensor::zeros([self.num_gemms, self.out_features], device))
            }),
            lowp,
            runtime: WeightCache::default(),
            delay_wgrad_compute: self.delay_wgrad_compute,
            fuse_wgrad_accumulation: self.fuse_wgrad_accumulation,
            fp8_scales: self.fp8_scales,
        })
    }
}

impl<B: Backend> GroupedLinear<B> {
    pub fn num_gemms(&self) -> usize {
        self.weight.dims()[0]
    }

    pub fn in_features(&self) -> usize {
        self.weight.dims()[2]
    }

    pub fn out_features(&self) -> usize {
        self.weight.dims()[1]
    }

    /// Expert `g`'s weight `[out, in]`.
    pub fn expert_weight(&self, g: usize) -> Tensor<B, 2> {
        let [_, out, inp] = self.weight.dims();
        self.weight.val().slice([g..g + 1, 0..out, 0..inp]).reshape([out, inp])
    }

    /// Expert `g`'s bias `[out]`.
    pub fn expert_bias(&self, g: usize) -> Option<Tensor<B, 1>> {
        self.bias.as_ref().map(|b| {
            let [_, out] = b.dims();
            b.val().slice([g..g + 1, 0..out]).reshape([out])
        })
    }

    /// Per-expert or shared FP8 scales (`GroupedLinearConfig::fp8_scales`).
    pub fn fp8_scales(&self) -> GroupScaling {
        self.fp8_scales
    }

    /// Weight quantizations so far (cached micro-batches do not add).
    pub fn weight_quantizations(&self) -> usize {
        self.lowp.weight_quantizations()
    }

    fn name(&self) -> String {
        if self.lowp.layout.name.is_empty() {
            "grouped_linear".to_string()
        } else {
            self.lowp.layout.name.clone()
        }
    }
}

impl<B: LowpLinear> GroupedLinear<B> {
    /// End of a training step: delayed-scaling scales are updated (no-op for other recipes).
    /// Errors only on delayed-scaling state that does not fit the module (a foreign record).
    pub fn end_step(&self) -> Result<(), LowpError> {
        self.lowp.end_step()
    }

    /// `[T, out]` for `x [T, in]` whose rows are the experts' tokens one expert after another,
    /// `m_splits [experts]` (on the device) tokens each.
    pub fn forward(&self, x: Tensor<B, 2>, m_splits: Tensor<B, 1, Int>) -> LowpResult<Tensor<B, 2>> {
        self.forward_microbatch(x, m_splits, None)
    }

    /// `forward` with the micro-batch weight cache (see the module docs).
    pub fn forward_microbatch(
        &self,
        x: Tensor<B, 2>,
        m_splits: Tensor<B, 1, Int>,
        is_first_microbatch: Option<bool>,
    ) -> LowpResult<Tensor<B, 2>> {
        let [tokens, features] = x.dims();
        self.check_features(features)?;
        let layout = self.layout(m_splits, tokens)?;
        // The op pads the token rows itself (inside the FP8 per-tensor cast and the bias
        // gradient: no padded copy of x or dY) and returns packed rows.
        self.forward_rows(x, InputRows::Packed, &layout, is_first_microbatch)
    }

    /// The aligned layout of `tokens` tokens split by `m_splits`, made on the device (the MoE
    /// layer makes it once and shares it between its grouped linears).
    pub fn layout(
        &self,
        m_splits: Tensor<B, 1, Int>,
        tokens: usize,
    ) -> LowpResult<GroupLayout<B::Quant>> {
        check_splits_shape(&m_splits.dims(), self.num_gemms())?;
        B::lowp_group_layout(m_splits.into_primitive(), tokens)
    }

    /// The experts on a batch already in `layout`'s aligned layout: `x [layout.rows(), in]` ->
    /// `[layout.rows(), out]` (padding rows stay zero).
    pub fn forward_aligned(
        &self,
        x: Tensor<B, 2>,
        layout: &GroupLayout<B::Quant>,
        is_first_microbatch: Option<bool>,
    ) -> LowpResult<Tensor<B, 2>> {
        self.forward_rows(x, InputRows::Aligned, layout, is_first_microbatch)
    }

    /// The experts on `x` laid out as `input_rows` says (`layout`'s aligned batch or its packed
    /// tokens) -> `[rows, out]` laid out the same way.
    fn forward_rows(
        &self,
        x: Tensor<B, 2>,
        input_rows: InputRows,
        layout: &GroupLayout<B::Quant>,
        is_first_microbatch: Option<bool>,
    ) -> LowpResult<Tensor<B, 2>> {
        let [rows, features] = x.dims();
        self.check_features(features)?;
        let (expected, which) = (input_rows.rows(layout), input_rows.name());
        if rows != expected || layout.groups.count != self.num_gemms() {
            return Err(LowpError::shape(
                format!("{} {which} input", self.name()),
                format!("[{rows}, {features}] for a layout of {} groups", layout.groups.count),
                format!(
                    "[{expected}, {features}] and one group per expert ({})",
                    self.num_gemms()
                ),
            ));
        }
        let mut observed = None;
        if let Some(debug) = LayerDebug::for_layer(&self.lowp.layout.name, &self.lowp.layout.kind)? {
            if debug.acts() {
                let experts: Vec<usize> = (0..self.num_gemms()).collect();
                if debug.changes_expert_gemms(&self.name(), &experts)? {
                    return match input_rows {
                        InputRows::Aligned => self.forward_experts_one_by_one(x, layout, &debug),
                        InputRows::Packed => {
                            let aligned = move_rows(x, layout, RowMove::Pad);
                            let y = self.forward_experts_one_by_one(aligned, layout, &debug)?;
                            Ok(move_rows(y, layout, RowMove::Unpad))
                        }
                    };
                }
                observed = Some(debug);
            }
        }
        let [experts, out, inp] = self.weight.dims();
        // A weight gradient that goes to main_grad or backward_dw must not be awaited by the
        // graph: the weight enters the op detached (the op still computes its gradient; the
        // input's tracking keeps the op in the graph).
        let w = if self.delay_wgrad_compute || self.fuse_wgrad_accumulation {
            // (Burn's detach keeps `require_grad`; drop it too.)
            self.weight.val().detach().set_require_grad(false)
        } else {
            // Through the installed gradient tap, if any (data parallelism's overlapped
            // reduction).
            grad_tap::tapped(&self.weight, &x)
        };
        let w = w.reshape([experts * out, inp]);
        let runtime = self.runtime(&w)?;
        if let Some(e) = runtime.errors.take() {
            return Err(e);
        }
        let wgrad = if self.delay_wgrad_compute {
            WgradTarget::Deferred(runtime.pending.clone())
        } else if self.fuse_wgrad_accumulation {
            WgradTarget::MainGrad {
                main_grad: runtime.main_grad.clone(),
                overwrite: is_first_microbatch == Some(true),
            }
        } else {
            WgradTarget::Graph
        };
        let mut op = self.lowp.grouped_linear_op(
            is_first_microbatch,
            runtime.weight_groups.clone(),
            wgrad,
            runtime.errors.clone(),
            self.fp8_scales,
        );
        op.debug = observed.map(|layer| ExpertsDebug {
            layer,
            weight_labels: runtime.weight_labels.clone(),
        });
        let (y, quantized_weight) = B::lowp_grouped_linear(
            x.into_primitive().tensor(),
            input_rows,
            w.into_primitive().tensor(),
            self.bias.as_ref().map(|b| b.val().into_primitive().tensor()),
            layout,
            op,
        )?;
        self.lowp.keep_weight(quantized_weight, is_first_microbatch);
        Ok(Tensor::from_primitive(TensorPrimitive::Float(y)))
    }

    /// The debug path (a debug session changes how a GEMM of this layer runs this iteration,
    /// `LayerDebug::changes_expert_gemms`; observing alone keeps the grouped op): each expert runs as
    /// its own quantized linear op named `<name>.gemm_<g>` (TE's debug GroupedLinear), so that
    /// statistics and AutoswitchGemm decisions are per expert. It reads the splits on the host
    /// (counted in `host_syncs()`), quantizes each expert's weight in the call (no cache) and
    /// returns the weight gradient through the autodiff graph.
    fn forward_experts_one_by_one(
        &self,
        x: Tensor<B, 2>,
        layout: &GroupLayout<B::Quant>,
        debug: &LayerDebug,
    ) -> LowpResult<Tensor<B, 2>> {
        if self.delay_wgrad_compute || self.fuse_wgrad_accumulation {
            return Err(LowpError::invalid(
                format!("{} under a debug session", self.name()),
                "delay_wgrad_compute or fuse_wgrad_accumulation",
                "the debug tools run the experts one by one through the autodiff graph; turn these options off while the layer is debugged",
            ));
        }
        let groups = layout.host_groups()?;
        let [rows, _] = x.dims();
        let [_, out, inp] = self.weight.dims();
        let mut y = Tensor::<B, 2>::zeros([rows, out], &x.device());
        for (g, group) in groups.iter().enumerate() {
            if group.used == 0 {
                continue;
            }
            // The expert's aligned rows (tokens, then zero padding to a multiple of 128): the
            // shapes its quantizers accept; statistics leave the padding out.
            let rows_g = group.start..group.start + group.len;
            let xg = x.clone().slice([rows_g.clone(), 0..inp]);
            let wg = self.weight.val().slice([g..g + 1, 0..out, 0..inp]).reshape([out, inp]);
            let view = debug.expert(format!("{}.gemm_{g}", self.name()), group.used);
            let op = self.lowp.linear_op_debug(g, None, Some(view));
            let (yg, _) = B::lowp_linear(xg.into_primitive().tensor(), wg.into_primitive().tensor(), None, op)?;
            let mut yg = Tensor::<B, 2>::from_primitive(TensorPrimitive::Float(yg));
            if let Some(bias) = &self.bias {
                // Biases on token rows only: padding rows stay zero.
                let mask = Tensor::<B, 1, burn::tensor::Int>::arange(0..group.len as i64, &x.device())
                    .lower_elem(group.used as i64)
                    .float()
                    .reshape([group.len, 1]);
                yg = yg + mask * bias.val().slice([g..g + 1, 0..out]);
            }
            y = y.slice_assign([rows_g, 0..out], yg);
        }
        Ok(y)
    }

    /// Runs the weight gradients deferred by `delay_wgrad_compute` (oldest first; one per
    /// backward since the last call) and hands them over: summed into `main_grad` with
    /// `fuse_wgrad_accumulation`, otherwise registered in `grads` as the weight's gradient
    /// (summed over the pending backwards). Without pending work it does nothing.
    pub fn backward_dw(&self, grads: &mut GradientsParams) -> LowpResult<()> {
        let Some(runtime) = self.runtime.get::<Arc<GroupedRuntime<B::Quant>>>() else {
            return Ok(());
        };
        let pending: Vec<_> = runtime
            .pending
            .lock()
            .expect("wgrad store lock")
            .drain(..)
            .collect();
        if pending.is_empty() {
            return Ok(());
        }
        let shape = self.weight.dims();
        if self.fuse_wgrad_accumulation {
            let mut main = runtime.main_grad.lock().expect("main_grad lock");
            for p in &pending {
                let dw = run_wgrad(p, main.take())?;
                *main = Some(B::Quant::float_cast(dw, burn::tensor::FloatDType::F32));
            }
            return Ok(());
        }
        let mut sum: Option<FloatTensor<B::Quant>> = None;
        for p in &pending {
            // A second pending backward accumulates in f32 (as main_grad would).
            sum = Some(run_wgrad(p, sum)?);
        }
        let dw: Tensor<B::Quant, 2> =
            Tensor::from_primitive(TensorPrimitive::Float(sum.expect("pending is not empty")));
        let dw = dw.reshape(shape).cast(self.weight.val().dtype());
        grads.register::<B::Quant, 3>(self.weight.id, dw);
        Ok(())
    }

    /// An error backward found and could not return (bad splits seen only when a backward GEMM
    /// read them on the host; see `BackwardErrors`), taken. `forward` also reports it.
    pub fn take_backward_error(&self) -> Option<LowpError> {
        self.runtime
            .get::<Arc<GroupedRuntime<B::Quant>>>()
            .and_then(|r| r.errors.take())
    }

    /// The f32 weight-gradient buffer of `fuse_wgrad_accumulation`, `[experts, out, in]`.
    pub fn main_grad(&self) -> Option<Tensor<B::Quant, 3>> {
        let runtime = self.runtime.get::<Arc<GroupedRuntime<B::Quant>>>()?;
        let main = runtime.main_grad.lock().expect("main_grad lock").clone()?;
        let t: Tensor<B::Quant, 2> = Tensor::from_primitive(TensorPrimitive::Float(main));
        Some(t.reshape(self.weight.dims()))
    }

    /// Registers `main_grad` (in the weight's dtype) as the weight's gradient in `grads`, for an
    /// optimizer that reads `GradientsParams`. Returns whether there was one.
    pub fn register_main_grad(&self, grads: &mut GradientsParams) -> bool {
        match self.main_grad() {
            Some(g) => {
                grads.register::<B::Quant, 3>(self.weight.id, g.cast(self.weight.val().dtype()));
                true
            }
            None => false,
        }
    }

    fn check_features(&self, features: usize) -> LowpResult<()> {
        if features != self.in_features() {
            return Err(LowpError::shape(
                format!("{} input", self.name()),
                format!("last dimension {features}"),
                format!("must equal in_features = {}", self.in_features()),
            ));
        }
        Ok(())
    }

    fn runtime(&self, w: &Tensor<B, 2>) -> LowpResult<Arc<GroupedRuntime<B::Quant>>> {
        if let Some(r) = self.runtime.get::<Arc<GroupedRuntime<B::Quant>>>() {
            return Ok(r);
        }
        let [experts, out, _] = self.weight.dims();
        let device = Tensor::<B::Quant, 2>::from_primitive(TensorPrimitive::Float(B::to_quant(
            w.clone().into_primitive().tensor(),
        )))
        .device();
        let labels: Vec<i32> = (0..experts * out).map(|r| (r / out) as i32).collect();
        let runtime = Arc::new(GroupedRuntime {
            weight_groups: Groups::from_host(uniform_groups(experts, out), experts * out, &device)?,
            weight_labels: Tensor::<B::Quant, 1, Int>::from_data(
                TensorData::new(labels, [experts * out]),
                &device,
            )
            .into_primitive(),
            pending: Arc::default(),
            main_grad: Arc::default(),
            errors: BackwardErrors::default(),
        });
        self.runtime.set(runtime.clone());
        Ok(runtime)
    }
}

/// `t` moved between the packed and aligned layouts of `layout` (also the MoE layer's moves).
pub(crate) fn move_rows<B: LowpLinear>(
    t: Tensor<B, 2>,
    layout: &GroupLayout<B::Quant>,
    direction: RowMove,
) -> Tensor<B, 2> {
    Tensor::from_primitive(TensorPrimitive::Float(B::lowp_move_rows(
        t.into_primitive().tensor(),
        layout,
        direction,
    )))
}
