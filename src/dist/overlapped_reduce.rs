//! Data parallelism's gradient reduction overlapped with backward (Megatron's
//! `overlap_grad_reduce`): each weight's gradient is all-reduced as soon as backward has it,
//! while backward goes on with the layers below, instead of all together after backward.
//!
//! The gradients come from a gradient tap (`ops::grad_tap`, which the layers' weights pass
//! through): `take` receives each one on the thread running backward. Over the micro-batches of
//! a step it keeps their sum; in the step's last micro-batch it adds the new part and queues the
//! all-reduce at once, unjoined (`TensorAllReduce::all_reduce_unjoined`: the GPU runs it beside
//! the rest of backward). `finish`, after that backward, joins the reductions and puts the
//! reduced gradients into the step's `GradientsParams`, cast back to their dtypes; it returns
//! which parameters it reduced, so that the reduction after backward (`reduce_gradients_in`)
//! covers only the others (those the layers do not tap: embeddings, norms, the router).
//!
//! Every rank's graph is the same, and Burn visits it in the same order on every rank, so every
//! rank queues the same all-reduces in the same order, as the collectives require. A failed
//! all-reduce is kept and returned by `finish` (backward itself cannot return an error).
//!
//! With micro-batches the reduction is that of the summed gradient, as after backward: one
//! all-reduce per parameter and step, whatever the number of micro-batches; only the last
//! micro-batch's backward overlaps it. Each reduced parameter is its own all-reduce (the
//! experts' weights are hundreds of MiB each; a dense layer's few MiB still run near the link's
//! rate).

use std::collections::HashSet;
use std::sync::{Arc, Mutex, MutexGuard};

use burn::module::ParamId;
use burn::optim::GradientsParams;
use burn::tensor::backend::Backend;
use burn::tensor::ops::FloatTensor;
use burn::tensor::{DType, Shape, Tensor, TensorMetadata, TensorPrimitive};

use super::grad_reduce::{register_flat, GradReduceOptions, ReduceOp, TensorAllReduce};
use crate::error::{LowpError, Result};

/// An all-reduce over some ranks and what its sum is divided by.
#[derive(Clone)]
struct Route<IB: Backend> {
    reducer: Arc<dyn TensorAllReduce<IB> + Send + Sync>,
    /// `None`: the reducer's ranks (NCCL's average); else the sum over them divided by this
    /// (expert parallelism's `ParallelLayout::grad_divisor`).
    divisor: Option<usize>,
}

/// A gradient whose all-reduce is queued: the flat result, not to be read before the join.
struct Queued<IB: Backend> {
    id: ParamId,
    shape: Vec<usize>,
    dtype: DType,
    reduced: Tensor<IB, 1>,
}

struct State<IB: Backend> {
    /// Whether the backward now running is the step's last micro-batch's.
    last: bool,
    /// The earlier micro-batches' gradients summed, in the order they came.
    held: Vec<(ParamId, FloatTensor<IB>)>,
    queued: Vec<Queued<IB>>,
    error: Option<LowpError>,
}

/// The overlapped reduction of one rank (see the module's docs).
pub struct OverlappedGradReduce<IB: Backend> {
    dense: Route<IB>,
    /// The experts' parameters and their route, under expert parallelism.
    experts: Option<(HashSet<ParamId>, Route<IB>)>,
    options: GradReduceOptions,
    state: Mutex<State<IB>>,
}

impl<IB: Backend> OverlappedGradReduce<IB> {
    /// Every tapped gradient averaged over `reducer`'s ranks, in FP32 or BF16 as `options` say.
    pub fn new(reducer: Arc<dyn TensorAllReduce<IB> + Send + Sync>, options: GradReduceOptions) -> Self {
        OverlappedGradReduce {
            dense: Route { reducer, divisor: None },
            experts: None,
            options,
            state: Mutex::new(State {
                last: true,
                held: Vec::new(),
                queued: Vec::new(),
                error: None,
            }),
        }
    }

    /// The parameters `experts` summed over `reducer`'s ranks (the expert-data-parallel group)
    /// and divided by `divisor` (the world size) instead.
    pub fn with_experts(mut self, experts: HashSet<ParamId>, reducer: Arc<dyn TensorAllReduce<IB> + Send + Sync>, divisor: usize) -> Self {
        self.experts = Some((experts, Route { reducer, divisor: Some(divisor.max(1)) }));
        self
    }

    fn state(&self) -> MutexGuard<'_, State<IB>> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Before micro-batch `index` of `count` runs forward: in the last one, the gradients are
    /// reduced as backward produces them; before, they are summed. The first forgets what an
    /// interrupted step left.
    pub fn start_micro_batch(&self, index: usize, count: usize) {
        let mut state = self.state();
        if index == 0 {
            state.held.clear();
            state.queued.clear();
            state.error = None;
        }
        state.last = index + 1 >= count;
    }

    fn route(&self, id: ParamId) -> &Route<IB> {
        match &self.experts {
            Some((ids, route)) if ids.contains(&id) => route,
            _ => &self.dense,
        }
    }

    /// A tapped gradient of parameter `id` (the gradient tap's sink).
    pub fn take(&self, id: ParamId, grad: FloatTensor<IB>) {
        let mut state = self.state();
        if state.error.is_some() {
            return;
        }
        let grad = match state.held.iter().position(|(held, _)| *held == id) {
            Some(i) => IB::float_add(state.held.remove(i).1, grad),
            None => grad,
        };
        if !state.last {
            state.held.push((id, grad));
            return;
        }
        if let Err(e) = self.queue(&mut state, id, grad) {
            state.error = Some(e);
        }
    }

    /// Queues the all-reduce of `grad` (unjoined).
    fn queue(&self, state: &mut State<IB>, id: ParamId, grad: FloatTensor<IB>) -> Result<()> {
        let shape = grad.shape().to_vec();
        let dtype = grad.dtype();
        let n: usize = shape.iter().product();
        let flat = Tensor::<IB, 1>::from_primitive(TensorPrimitive::Float(IB::float_reshape(grad, Shape::new([n]))));
        let flat = flat.cast(if self.options.in_fp32 { DType::F32 } else { DType::BF16 });
        let route = self.route(id);
        // The division comes first: the result may not be touched before the join. (Exact for
        // a power of two; otherwise within a rounding of dividing the sum.)
        let reduced = match route.divisor {
            None => route.reducer.all_reduce_unjoined(flat, ReduceOp::Avg)?,
            Some(d) => route.reducer.all_reduce_unjoined(flat.div_scalar(d as f64), ReduceOp::Sum)?,
        };
        state.queued.push(Queued { id, shape, dtype, reduced });
        Ok(())
    }

    /// After the step's last backward: joins the reductions and registers the reduced
    /// gradients in `grads` (in their parameters' shapes and dtypes); a gradient held from an
    /// earlier micro-batch that the last one did not add to is reduced here. Returns the
    /// parameters it reduced. A parameter whose gradient is also in `grads` (used somewhere
    /// without the tap: it would be reduced twice or not at all) is an error, as is a failed
    /// all-reduce.
    pub fn finish(&self, grads: &mut GradientsParams) -> Result<HashSet<ParamId>> {
        let mut state = self.state();
        if let Some(e) = state.error.take() {
            return Err(e);
        }
        let held = std::mem::take(&mut state.held);
        for (id, grad) in held {
            self.queue(&mut state, id, grad)?;
        }
        self.dense.reducer.join()?;
        if let Some((_, route)) = &self.experts {
            route.reducer.join()?;
        }
        let mut reduced: Vec<(ParamId, Vec<usize>, DType, Tensor<IB, 1>)> = Vec::new();
        for q in state.queued.drain(..) {
            match reduced.iter_mut().find(|r| r.0 == q.id) {
                // One weight used twice: its two parts.
                Some(r) => r.3 = r.3.clone() + q.reduced,
                None => reduced.push((q.id, q.shape, q.dtype, q.reduced)),
            }
        }
        let mut ids = HashSet::new();
        for (id, shape, dtype, flat) in reduced {
            let flat = if flat.dtype() == dtype { flat } else { flat.cast(dtype) };
            if !register_flat(grads, id, &shape, flat) {
                return Err(LowpError::invalid(
                    format!("the gradient of parameter {id} (shape {shape:?})"),
                    "both tapped and in backward's gradients, or of rank above 6",
                    "a tapped parameter must pass the gradient tap wherever it is used",
                ));
            }
            ids.insert(id);
        }
        Ok(ids)
    }
}
