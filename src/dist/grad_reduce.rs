//! Data parallelism's gradient reduction: every rank's gradients averaged over the ranks after
//! backward, in few large collectives over flat buffers (buckets).
//!
//! Megatron's DDP starts a bucket's all-reduce while backward still runs, from per-parameter
//! hooks that fire as each gradient is produced. Burn 0.21 has no such hook: `backward()` runs
//! the whole graph and returns the gradients together. The layers' weights get one from the
//! gradient tap they pass through (`ops::grad_tap`), and `overlapped_reduce` reduces them during
//! backward; this file reduces what is left after backward (or everything, without the
//! overlap): after gradient accumulation over micro-batches, once a step, in as few calls as the
//! bucket cap allows: each bucket is the
//! gradients of consecutive parameters (in the module's visiting order, the same on every rank),
//! cast to the reduction's dtype, flattened and concatenated; one all-reduce (average) of the
//! bucket; then sliced back into the parameters' shapes and dtypes. A parameter that got no
//! gradient on this rank (e.g. an expert no token of its shard reached) contributes zeros, so
//! every rank issues the same collectives with the same sizes.
//!
//! `TensorAllReduce` is what the reduction is written against: NCCL on CubeCL tensors
//! (`tensor_collectives`), or anything else (a test's stand-in on the CPU).

use burn::module::{AutodiffModule, ModuleVisitor, Param, ParamId};
use burn::optim::GradientsParams;
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{DType, Tensor, TensorCreationOptions};

use crate::error::Result;

/// A reduction over the ranks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReduceOp {
    Sum,
    Max,
    /// The sum divided by the communicator's size (NCCL's `ncclAvg`).
    Avg,
}

/// An all-reduce of one flat tensor over the ranks, in the tensor's dtype (F32 or BF16); every
/// rank calls it with the same length and dtype, in the same order.
pub trait TensorAllReduce<B: Backend> {
    fn all_reduce(&self, tensor: Tensor<B, 1>, op: ReduceOp) -> Result<Tensor<B, 1>>;

    /// `all_reduce` whose result may still be in flight when it returns, while the caller's
    /// next device work goes on beside it (overlap): the result must not be used before `join`.
    /// By default the plain all-reduce.
    fn all_reduce_unjoined(&self, tensor: Tensor<B, 1>, op: ReduceOp) -> Result<Tensor<B, 1>> {
        self.all_reduce(tensor, op)
    }

    /// After it, the results of every `all_reduce_unjoined` before it may be used.
    fn join(&self) -> Result<()> {
        Ok(())
    }
}

/// Elements of one gradient bucket at most: 128 Mi elements, 512 MiB in FP32. The bucket is a
/// copy of the gradients it holds, so the cap bounds the reduction's extra memory; at this size
/// one all-reduce runs at NCCL's full bandwidth, and a 2B-parameter model takes about 15.
pub const GRAD_BUCKET_ELEMENTS: usize = 128 << 20;

/// How the gradients are reduced.
#[derive(Debug, Clone, Copy)]
pub struct GradReduceOptions {
    /// Reduce in FP32 (else BF16): FP32 sums without the BF16 rounding of each partial sum.
    pub in_fp32: bool,
    /// Elements of a bucket at most (a larger parameter is a bucket of its own).
    pub bucket_elements: usize,
}

impl Default for GradReduceOptions {
    fn default() -> Self {
        GradReduceOptions {
            in_fp32: true,
            bucket_elements: GRAD_BUCKET_ELEMENTS,
        }
    }
}

/// One trainable float parameter: its id and shape.
struct ParamSlot {
    id: ParamId,
    shape: Vec<usize>,
}

/// The trainable float parameters of a module, in visiting order, and the device of the first.
struct CollectParams<B: AutodiffBackend> {
    slots: Vec<ParamSlot>,
    device: Option<burn::tensor::Device<B::InnerBackend>>,
}

impl<B: AutodiffBackend> CollectParams<B> {
    fn of<M: AutodiffModule<B>>(module: &M) -> Self {
        let mut params = CollectParams { slots: Vec::new(), device: None };
        module.visit(&mut params);
        params
    }
}

impl<B: AutodiffBackend> ModuleVisitor<B> for CollectParams<B> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        if param.is_require_grad() {
            if self.device.is_none() {
                self.device = Some(param.val().inner().device());
            }
            self.slots.push(ParamSlot {
                id: param.id,
                shape: param.shape().to_vec(),
            });
        }
    }
}

/// The gradient of `slot` out of `grads`, flat, in `dtype` (zeros if it has none), with the
/// dtype it had.
fn take_flat<B: Backend>(grads: &mut GradientsParams, slot: &ParamSlot, dtype: DType, device: &B::Device) -> (Tensor<B, 1>, Option<DType>) {
    fn take<B: Backend, const D: usize>(grads: &mut GradientsParams, id: ParamId) -> Option<(Tensor<B, 1>, DType)> {
        grads.remove::<B, D>(id).map(|g| {
            let dtype = g.dtype();
            (g.reshape([-1]), dtype)
        })
    }
    let taken = match slot.shape.len() {
        1 => take::<B, 1>(grads, slot.id),
        2 => take::<B, 2>(grads, slot.id),
        3 => take::<B, 3>(grads, slot.id),
        4 => take::<B, 4>(grads, slot.id),
        5 => take::<B, 5>(grads, slot.id),
        6 => take::<B, 6>(grads, slot.id),
        _ => None,
    };
    let elements = slot.shape.iter().product::<usize>();
    match taken {
        Some((flat, original)) => (flat.cast(dtype), Some(original)),
        None => (Tensor::<B, 1>::zeros([elements], TensorCreationOptions::new(device.clone()).with_dtype(dtype)), None),
    }
}

fn put_back<B: Backend>(grads: &mut GradientsParams, slot: &ParamSlot, flat: Tensor<B, 1>) {
    // Taken out before: there is no gradient of the parameter left in `grads`.
    let _ = register_flat(grads, slot.id, &slot.shape, flat);
}

/// Registers `flat` in `shape` as parameter `id`'s gradient; `false` (and nothing registered)
/// if `grads` already holds one or the rank is not 1 to 6.
pub(crate) fn register_flat<B: Backend>(grads: &mut GradientsParams, id: ParamId, shape: &[usize], flat: Tensor<B, 1>) -> bool {
    fn put<B: Backend, const D: usize>(grads: &mut GradientsParams, id: ParamId, flat: Tensor<B, 1>, shape: &[usize]) -> bool {
        if grads.get::<B, D>(id).is_some() {
            return false;
        }
        let dims: [usize; D] = shape.try_into().expect("the parameter's rank");
        grads.register::<B, D>(id, flat.reshape(dims));
        true
    }
    match shape.len() {
        1 => put::<B, 1>(grads, id, flat, shape),
        2 => put::<B, 2>(grads, id, flat, shape),
        3 => put::<B, 3>(grads, id, flat, shape),
        4 => put::<B, 4>(grads, id, flat, shape),
        5 => put::<B, 5>(grads, id, flat, shape),
        6 => put::<B, 6>(grads, id, flat, shape),
        _ => false,
    }
}

/// Consecutive parameters whose elements sum to at most `cap` (one larger parameter alone).
fn buckets(sizes: &[usize], cap: usize) -> Vec<std::ops::Range<usize>> {
    let mut out = Vec::new();
    let (mut start, mut held) = (0, 0);
    for (i, &n) in sizes.iter().enumerate() {
        if i > start && held + n > cap {
            out.push(start..i);
            (start, held) = (i, 0);
        }
        held += n;
    }
    if start < sizes.len() {
        out.push(start..sizes.len());
    }
    out
}

/// The number of all-reduces `reduce_gradients` issues for `module` (for logs and tests).
pub fn gradient_buckets<B: AutodiffBackend, M: AutodiffModule<B>>(module: &M, options: GradReduceOptions) -> usize {
    let params = CollectParams::<B>::of(module);
    let sizes: Vec<usize> = params.slots.iter().map(|p| p.shape.iter().product()).collect();
    buckets(&sizes, options.bucket_elements.max(1)).len()
}

/// Which parameters a reduction covers and what their sum is divided by. Under expert
/// parallelism the experts' gradients are reduced over the expert-data-parallel group but
/// divided by the world size (`ParallelLayout::grad_divisor`), the rest over the world.
#[derive(Clone, Copy)]
pub struct ReduceScope<'a> {
    /// Only the parameters this keeps (`None`: all of the module's).
    pub keep: Option<&'a dyn Fn(ParamId) -> bool>,
    /// The sum over the reducer's ranks is divided by this (`None`: by their number, NCCL's
    /// average).
    pub divisor: Option<usize>,
}

impl ReduceScope<'_> {
    /// Every parameter, averaged over the reducer's ranks (data parallelism).
    pub const ALL: ReduceScope<'static> = ReduceScope { keep: None, divisor: None };
}

/// Averages `grads` (of `module`'s parameters) over the ranks through `reducer`: every
/// trainable float parameter of `module` gets the mean of the ranks' gradients, in its own dtype
/// (a parameter no rank had a gradient for gets zeros, as the optimizer would see with one
/// rank's zero gradient). Queued without waiting when the reducer does not wait.
pub fn reduce_gradients<B: AutodiffBackend, M: AutodiffModule<B>>(
    module: &M,
    grads: GradientsParams,
    reducer: &dyn TensorAllReduce<B::InnerBackend>,
    options: GradReduceOptions,
) -> Result<GradientsParams> {
    reduce_gradients_in::<B, M>(module, grads, reducer, options, ReduceScope::ALL)
}

/// `reduce_gradients` of the parameters `scope` keeps, their sum divided as `scope` says; the
/// other gradients are left as they are. Every rank of `reducer` must pass the same scope.
pub fn reduce_gradients_in<B: AutodiffBackend, M: AutodiffModule<B>>(
    module: &M,
    mut grads: GradientsParams,
    reducer: &dyn TensorAllReduce<B::InnerBackend>,
    options: GradReduceOptions,
    scope: ReduceScope,
) -> Result<GradientsParams> {
    let CollectParams { slots: mut params, device } = CollectParams::<B>::of(module);
    if let Some(keep) = scope.keep {
        params.retain(|p| keep(p.id));
    }
    let Some(inner_device) = device else {
        return Ok(grads);
    };
    if params.is_empty() {
        return Ok(grads);
    }
    let dtype = if options.in_fp32 { DType::F32 } else { DType::BF16 };
    let sizes: Vec<usize> = params.iter().map(|p| p.shape.iter().product()).collect();
    for range in buckets(&sizes, options.bucket_elements.max(1)) {
        let mut flats = Vec::with_capacity(range.len());
        let mut dtypes = Vec::with_capacity(range.len());
        for slot in &params[range.clone()] {
            let (flat, original) = take_flat::<B::InnerBackend>(&mut grads, slot, dtype, &inner_device);
            flats.push(flat);
            dtypes.push(original);
        }
        let bucket = if flats.len() == 1 { flats.pop().expect("one") } else { Tensor::cat(flats, 0) };
        let reduced = match scope.divisor {
            None => reducer.all_reduce(bucket, ReduceOp::Avg)?,
            Some(n) => reducer.all_reduce(bucket, ReduceOp::Sum)?.div_scalar(n as f64),
        };
        let mut offset = 0;
        for (slot, original) in params[range].iter().zip(dtypes) {
            let n = slot.shape.iter().product::<usize>();
            let part = reduced.clone().slice([offset..offset + n]);
            offset += n;
            let part = match original {
                Some(d) if d != dtype => part.cast(d),
                Some(_) => part,
                // No gradient here: the parameter's own dtype is the gradient's.
                None => part,
            };
            put_back::<B::InnerBackend>(&mut grads, slot, part);
        }
    }
    Ok(grads)
}

#[cfg(test)]
mod tests {
    use super::buckets;

    #[test]
    fn buckets_hold_consecutive_params_up_to_the_cap() {
        assert_eq!(buckets(&[3, 3, 3, 3], 6), vec![0..2, 2..4]);
        assert_eq!(buckets(&[3, 10, 3], 6), vec![0..1, 1..2, 2..3]);
        assert_eq!(buckets(&[1, 1, 1], 100), vec![0..3]);
        assert_eq!(buckets(&[], 100), Vec::<std::ops::Range<usize>>::new());
    }
}
