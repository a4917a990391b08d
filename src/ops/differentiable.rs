//! One way to run a differentiable op with its own backward on any `LowpLinear` backend:
//! `LowpLinear::lowp_differentiable(inputs, op)`. The op (`DifferentiableOp`) is its forward on
//! the inner backend, what backward keeps, and its backward from the output's gradient; on
//! `Autodiff` the call registers that backward in the graph (`OpBackward`), elsewhere it runs the
//! forward alone. RoPE (`rope_op::RopeOp`), the causal softmax (`softmax_op::CausalSoftmaxOp`) and
//! the batched product (`batched_matmul::BatchedMatmulOp`) are such ops: the differentiable
//! entry point of the backend op each wraps (`AttentionOps`, `GemmOps`).

use std::fmt::Debug;
use std::marker::PhantomData;

use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::Autodiff;
use burn::tensor::ops::FloatTensor;

use crate::backend::LowpBackend;
use crate::error::Result;

/// An op of `N` float inputs and one output with its own backward, on backend `B`.
pub trait DifferentiableOp<B: LowpBackend, const N: usize>: Debug + Send + Sized + 'static {
    /// What backward keeps.
    type State: Clone + Debug + Send + 'static;

    /// The output from the inputs, and what backward will need; `tracked[i]` says whether input
    /// i needs a gradient, so that nothing is kept for one that does not.
    fn forward(
        self,
        inputs: [FloatTensor<B>; N],
        tracked: [bool; N],
    ) -> Result<(FloatTensor<B>, Self::State)>;

    /// The gradients of the inputs where `wanted`, from the output's gradient. Shapes were
    /// checked in forward, so a failure here is a bug, not user input.
    fn backward(
        state: Self::State,
        grad: FloatTensor<B>,
        wanted: [bool; N],
    ) -> [Option<FloatTensor<B>>; N];
}

/// The backward of a `DifferentiableOp` in Burn's autodiff graph.
#[derive(Debug)]
struct OpBackward<Op>(PhantomData<Op>);

impl<B: LowpBackend, Op: DifferentiableOp<B, N>, const N: usize> Backward<B, N> for OpBackward<Op> {
    type State = Op::State;

    fn backward(self, ops: Ops<Self::State, N>, grads: &mut Gradients, _: &mut Checkpointer) {
        let wanted = ops.parents.each_ref().map(Option::is_some);
        let grad = grads.consume::<B>(&ops.node);
        let inputs = Op::backward(ops.state, grad, wanted);
        for (node, grad) in ops.parents.into_iter().zip(inputs) {
            if let (Some(node), Some(grad)) = (node, grad) {
                grads.register::<B>(node.id, grad);
            }
        }
    }
}

/// `op` on `Autodiff<B>`: its forward on the inner tensors, its backward registered where an
/// input is tracked (compute-bound in Burn's checkpointing sense: the output is kept, never
/// recomputed).
pub(crate) fn differentiable_autodiff<B, C, Op, const N: usize>(
    inputs: [FloatTensor<Autodiff<B, C>>; N],
    op: Op,
) -> Result<FloatTensor<Autodiff<B, C>>>
where
    B: LowpBackend,
    C: CheckpointStrategy,
    Op: DifferentiableOp<B, N>,
{
    let tracked = inputs.each_ref().map(|t| t.is_tracked());
    let (y, state) = op.forward(inputs.each_ref().map(|t| t.primitive.clone()), tracked)?;
    Ok(
        match OpBackward::<Op>(PhantomData)
            .prepare::<C>(inputs.map(|t| t.node.clone()))
            .compute_bound()
            .stateful()
        {
            OpsKind::Tracked(prep) => prep.finish(state, y),
            OpsKind::UnTracked(prep) => prep.finish(y),
        },
    )
}
