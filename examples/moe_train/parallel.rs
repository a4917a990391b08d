//! Data parallel training (several ranks, one GPU each; `--nproc-per-node N` or torchrun's
//! variables, docs/multi-gpu.md): what the training loop does differently on a rank.
//!
//! Each rank trains on its shard of every micro-batch (`TrainConfig::rank_rows`); the gradients
//! are averaged over the ranks: the layers' weights as backward produces them, beside the rest
//! of backward (`train.overlap_grad_reduce`: `OverlappedGradReduce`, fed by the layers' gradient
//! tap), the other parameters after backward in buckets (`burn_lowp::dist::reduce_gradients_in`);
//! the delayed-
//! scaling amaxes of the step are reduced with MAX in one call before the scales are updated
//! (TE's `reduce_and_update_fp8_tensors`), and the routers' expert loads are summed, so that every
//! rank updates the same scales and biases the one-GPU run of the global batch would; the logged
//! losses are averaged over the ranks. Rank 0 alone writes files, but the expert shards of an
//! expert-parallel checkpoint (`checkpoint::save_sharded`).
//!
//! Expert parallelism (`train.expert_parallel_size` = ep > 1, `ExpertParallel`): the ranks form
//! groups of ep consecutive ranks; each rank holds `num_experts / ep` experts and the MoE layers
//! exchange tokens over its group (`MoeLm::forward_loss_with`). Data stays sharded over every
//! rank. The experts' gradients are summed over the ranks holding the same experts (the
//! expert-data-parallel group) and divided by the world size (`ParallelLayout::grad_divisor`),
//! the other gradients averaged over the world; the experts' delayed-scaling amaxes take their
//! maximum over the expert-data-parallel group, the others over the world.

use std::collections::HashSet;
use std::sync::Arc;

use burn::module::ParamId;
use burn::optim::GradientsParams;
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{DType, Int, Tensor};
use burn_lowp::dist::{
    reduce_gradients_in, GradReduceOptions, OverlappedGradReduce, ParallelLayout, ReduceOp, ReduceScope, TensorAllReduce, TokenAllToAll,
};
use burn_lowp::error::LowpError;
use burn_lowp::moe::MoeLm;
use burn_lowp::nn::LowpState;
use burn_lowp::ops::grad_tap::{GradientSink, ParamTap};
use burn_lowp::ops::LowpLinear;

/// A rank of a data parallel run: the collectives over every rank, on the inner backend `IB`
/// (where gradients live), and the expert-parallel group's when ep > 1.
pub struct DataParallel<'a, B: AutodiffBackend> {
    pub rank: usize,
    pub world_size: usize,
    pub reducer: &'a dyn TensorAllReduce<B::InnerBackend>,
    /// `Err` once a peer died or a collective failed or timed out: checked once a step.
    pub check: &'a dyn Fn() -> Result<(), LowpError>,
    pub grad_reduce: GradReduceOptions,
    /// `None` when every rank holds every expert (ep = 1).
    pub expert_parallel: Option<ExpertParallel<'a, B>>,
    /// The reduction overlapped with backward (`train.overlap_grad_reduce`); `None`: every
    /// gradient is reduced after backward.
    pub overlap: Option<OverlapParts<'a, B>>,
}

/// What the overlapped reduction is made of: the collectives, owned (the layers' gradient tap
/// keeps them in the autodiff graph), and the tap of the concrete autodiff backend.
pub struct OverlapParts<'a, B: AutodiffBackend> {
    pub world: Arc<dyn TensorAllReduce<B::InnerBackend> + Send + Sync>,
    /// The expert-data-parallel group's, under expert parallelism.
    pub experts: Option<Arc<dyn TensorAllReduce<B::InnerBackend> + Send + Sync>>,
    /// The gradient tap handing gradients to a sink (`ops::grad_tap::GradientTap` of `B`).
    pub tap: &'a dyn Fn(GradientSink<B::InnerBackend>) -> Arc<dyn ParamTap<B>>,
}

/// A step's overlapped reduction: the reducer and the tap the layers' weights pass through.
pub struct Overlap<B: AutodiffBackend> {
    pub reduce: Arc<OverlappedGradReduce<B::InnerBackend>>,
    pub tap: Arc<dyn ParamTap<B>>,
}

/// A rank's part in expert parallelism.
pub struct ExpertParallel<'a, B: AutodiffBackend> {
    pub layout: ParallelLayout,
    /// This rank's index in its EP group: which experts it holds.
    pub ep_rank: usize,
    /// The token exchange over the EP group (differentiable).
    pub exchange: &'a dyn TokenAllToAll<B>,
    /// The all-reduce over the ranks that hold the same experts.
    pub expert_reducer: &'a dyn TensorAllReduce<B::InnerBackend>,
}

impl<B: AutodiffBackend> DataParallel<'_, B> {
    pub fn is_writer(&self) -> bool {
        self.rank == 0
    }

    /// The token exchange the model's forward takes (`None` without expert parallelism).
    pub fn exchange(&self) -> Option<&dyn TokenAllToAll<B>> {
        self.expert_parallel.as_ref().map(|ep| ep.exchange)
    }

    /// The overlapped reduction for `model` (its parameters as loaded), if the run asks for it.
    pub fn overlap(&self, model: &MoeLm<B>) -> Option<Overlap<B>>
    where
        B: LowpLinear,
    {
        let parts = self.overlap.as_ref()?;
        let mut reduce = OverlappedGradReduce::new(parts.world.clone(), self.grad_reduce);
        if let (Some(ep), Some(experts)) = (&self.expert_parallel, &parts.experts) {
            reduce = reduce.with_experts(model.expert_param_ids(), experts.clone(), ep.layout.grad_divisor());
        }
        let reduce = Arc::new(reduce);
        let sink = reduce.clone();
        let tap = (parts.tap)(Arc::new(move |id, grad| sink.take(id, grad)));
        Some(Overlap { reduce, tap })
    }

    /// The step's gradients averaged over the ranks (but those in `reduced`, which the
    /// overlapped reduction has averaged): every gradient over the world without expert
    /// parallelism; with it, the experts' summed over the expert-data-parallel group and
    /// divided by the world size, the others averaged over the world.
    pub fn reduce_gradients(&self, model: &MoeLm<B>, grads: GradientsParams, reduced: &HashSet<ParamId>) -> Result<GradientsParams, LowpError>
    where
        B: LowpLinear,
    {
        let Some(ep) = &self.expert_parallel else {
            let rest = |id| !reduced.contains(&id);
            let scope = ReduceScope { keep: Some(&rest), divisor: None };
            return reduce_gradients_in::<B, _>(model, grads, self.reducer, self.grad_reduce, scope);
        };
        let experts = model.expert_param_ids();
        let is_expert = |id| experts.contains(&id) && !reduced.contains(&id);
        let is_dense = |id| !experts.contains(&id) && !reduced.contains(&id);
        let grads = reduce_gradients_in::<B, _>(
            model,
            grads,
            ep.expert_reducer,
            self.grad_reduce,
            ReduceScope {
                keep: Some(&is_expert),
                divisor: Some(ep.layout.grad_divisor()),
            },
        )?;
        reduce_gradients_in::<B, _>(
            model,
            grads,
            self.reducer,
            self.grad_reduce,
            ReduceScope {
                keep: Some(&is_dense),
                divisor: None,
            },
        )
    }

    /// Returns once every rank has called it: a one-element all-reduce read on the host (the
    /// checkpoint of an expert-parallel run waits here until every shard is written).
    pub fn barrier(&self, device: &B::Device) -> Result<(), LowpError> {
        let one = Tensor::<B::InnerBackend, 1>::zeros([1], device).cast(DType::F32);
        let reduced = self.reducer.all_reduce(one, ReduceOp::Sum)?;
        reduced.into_data();
        (self.check)()
    }

    /// The mean over the ranks of `values` (one all-reduce, in FP32).
    pub fn average(&self, values: Tensor<B::InnerBackend, 1>) -> Result<Tensor<B::InnerBackend, 1>, LowpError> {
        let dtype = values.dtype();
        Ok(self.reducer.all_reduce(values.cast(DType::F32), ReduceOp::Avg)?.cast(dtype))
    }

    /// The routers' expert loads of the step summed over the ranks (one all-reduce, in FP32:
    /// exact below 2^24 tokens an expert).
    pub fn sum_loads(&self, loads: Vec<Tensor<B, 1, Int>>) -> Result<Vec<Tensor<B, 1, Int>>, LowpError> {
        if loads.is_empty() {
            return Ok(loads);
        }
        let sizes: Vec<usize> = loads.iter().map(|l| l.dims()[0]).collect();
        let flat = Tensor::cat(loads.into_iter().map(|l| l.inner().float().cast(DType::F32)).collect(), 0);
        let summed = self.reducer.all_reduce(flat, ReduceOp::Sum)?.int();
        let mut offset = 0;
        Ok(sizes
            .into_iter()
            .map(|n| {
                let part = summed.clone().slice([offset..offset + n]);
                offset += n;
                Tensor::from_inner(part)
            })
            .collect())
    }

    /// Row 0 of every delayed-scaling amax history (this step's amaxes) replaced by its maximum
    /// over the ranks that hold the same weights (the experts' over the expert-data-parallel
    /// group under expert parallelism, everything else over the world), in one all-reduce per
    /// group, before `end_step` turns the histories into scales. A no-op without delayed scaling.
    pub fn reduce_amaxes(&self, model: &MoeLm<B>) -> Result<(), LowpError>
    where
        B: LowpLinear,
    {
        let Some(ep) = &self.expert_parallel else {
            return reduce_amaxes_over(model.lowp_states(), self.reducer);
        };
        let experts: Vec<*const LowpState<B>> = model
            .layers
            .iter()
            .flat_map(|l| [&l.moe.experts.fc1.lowp as *const _, &l.moe.experts.fc2.lowp as *const _])
            .collect();
        let (expert_states, dense): (Vec<_>, Vec<_>) =
            model.lowp_states().into_iter().partition(|s| experts.contains(&(*s as *const _)));
        reduce_amaxes_over(expert_states, ep.expert_reducer)?;
        reduce_amaxes_over(dense, self.reducer)
    }
}

/// Row 0 of the amax histories of `states` replaced by its maximum over `reducer`'s ranks.
fn reduce_amaxes_over<B>(states: Vec<&LowpState<B>>, reducer: &dyn TensorAllReduce<B::InnerBackend>) -> Result<(), LowpError>
where
    B: AutodiffBackend + LowpLinear,
{
    let states: Vec<_> = states
        .into_iter()
        .flat_map(|s| [s.delayed_forward.as_ref(), s.delayed_backward.as_ref()])
        .flatten()
        .collect();
    if states.is_empty() {
        return Ok(());
    }
    let rows: Vec<Tensor<B::InnerBackend, 1>> = states
        .iter()
        .map(|s| {
            let history = s.amax_history.value().inner();
            let [_, slots] = history.dims();
            history.slice([0..1, 0..slots]).reshape([slots])
        })
        .collect();
    let widths: Vec<usize> = rows.iter().map(|r| r.dims()[0]).collect();
    let reduced = reducer.all_reduce(Tensor::cat(rows, 0).cast(DType::F32), ReduceOp::Max)?;
    let mut offset = 0;
    for (state, width) in states.into_iter().zip(widths) {
        let row = reduced.clone().slice([offset..offset + width]).reshape([1, width]);
        offset += width;
        let history = state.amax_history.value().inner();
        let dtype = history.dtype();
        let merged = history.slice_assign([0..1, 0..width], row.cast(dtype));
        state.amax_history.set(Tensor::from_inner(merged));
    }
    Ok(())
}
