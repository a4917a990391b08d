//! Data parallel training (several ranks, one GPU each; `--nproc-per-node N` or torchrun's
//! variables, docs/multi-gpu.md): what the training loop does differently on a rank.
//!
//! Each rank trains on its shard of every micro-batch (`TrainConfig::rank_rows`); after backward
//! the gradients are averaged over the ranks (`burn_lowp::dist::reduce_gradients`, in buckets
//! after backward: Burn 0.21 has no per-parameter hook to start them during it); the delayed-
//! scaling amaxes of the step are reduced with MAX in one call before the scales are updated
//! (TE's `reduce_and_update_fp8_tensors`), and the routers' expert loads are summed, so that every
//! rank updates the same scales and biases the one-GPU run of the global batch would; the logged
//! losses are averaged over the ranks. Rank 0 alone writes files.

use burn::module::AutodiffModule;
use burn::optim::GradientsParams;
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{DType, Int, Tensor};
use burn_lowp::dist::{reduce_gradients, GradReduceOptions, ReduceOp, TensorAllReduce};
use burn_lowp::error::LowpError;
use burn_lowp::moe::MoeLm;
use burn_lowp::ops::LowpLinear;

/// A rank of a data parallel run: the collectives over every rank, on the inner backend `IB`
/// (where gradients live).
pub struct DataParallel<'a, IB: Backend> {
    pub rank: usize,
    pub world_size: usize,
    pub reducer: &'a dyn TensorAllReduce<IB>,
    /// `Err` once a peer died or a collective failed or timed out: checked once a step.
    pub check: &'a dyn Fn() -> Result<(), LowpError>,
    pub grad_reduce: GradReduceOptions,
}

impl<IB: Backend> DataParallel<'_, IB> {
    pub fn is_writer(&self) -> bool {
        self.rank == 0
    }

    /// The step's gradients averaged over the ranks.
    pub fn reduce_gradients<B, M>(&self, module: &M, grads: GradientsParams) -> Result<GradientsParams, LowpError>
    where
        B: AutodiffBackend<InnerBackend = IB>,
        M: AutodiffModule<B>,
    {
        reduce_gradients::<B, M>(module, grads, self.reducer, self.grad_reduce)
    }

    /// The mean over the ranks of `values` (one all-reduce, in FP32).
    pub fn average(&self, values: Tensor<IB, 1>) -> Result<Tensor<IB, 1>, LowpError> {
        let dtype = values.dtype();
        Ok(self.reducer.all_reduce(values.cast(DType::F32), ReduceOp::Avg)?.cast(dtype))
    }

    /// The routers' expert loads of the step summed over the ranks (one all-reduce, in FP32:
    /// exact below 2^24 tokens an expert).
    pub fn sum_loads<B>(&self, loads: Vec<Tensor<B, 1, Int>>) -> Result<Vec<Tensor<B, 1, Int>>, LowpError>
    where
        B: AutodiffBackend<InnerBackend = IB>,
    {
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
    /// over the ranks, in one all-reduce, before `end_step` turns the histories into scales. A
    /// no-op without delayed scaling.
    pub fn reduce_amaxes<B>(&self, model: &MoeLm<B>) -> Result<(), LowpError>
    where
        B: AutodiffBackend<InnerBackend = IB> + LowpLinear,
    {
        let states: Vec<_> = model
            .lowp_states()
            .into_iter()
            .flat_map(|s| [s.delayed_forward.as_ref(), s.delayed_backward.as_ref()])
            .flatten()
            .collect();
        if states.is_empty() {
            return Ok(());
        }
        let rows: Vec<Tensor<IB, 1>> = states
            .iter()
            .map(|s| {
                let history = s.amax_history.value().inner();
                let [_, slots] = history.dims();
                history.slice([0..1, 0..slots]).reshape([slots])
            })
            .collect();
        let widths: Vec<usize> = rows.iter().map(|r| r.dims()[0]).collect();
        let reduced = self.reducer.all_reduce(Tensor::cat(rows, 0).cast(DType::F32), ReduceOp::Max)?;
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
}
