//! The token all-to-all as a differentiable op: forward exchanges the rows with splits
//! `(send, recv)`, backward exchanges their gradient with the splits swapped, so each gradient
//! row travels back to the rank its row came from (`AllToAllSplits::transposed`).
//!
//! Backward runs the collective from inside Burn's autodiff pass: every rank's graph holds the
//! same exchanges (the same layers), which Burn visits in the same order on every rank, so the
//! ranks issue the backward all-to-alls in the same order, as the collectives require.

use std::sync::Arc;

use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::Autodiff;
use burn::tensor::backend::Backend;
use burn::tensor::ops::FloatTensor;
use burn::tensor::{Int, Tensor, TensorPrimitive};

use super::token_exchange::TokenAllToAll;
use crate::error::Result;

/// An exchange on backend `B` made differentiable on `Autodiff<B, C>`.
#[derive(Debug, Clone)]
pub struct DifferentiableAllToAll<B: Backend> {
    inner: Arc<dyn TokenAllToAll<B>>,
}

impl<B: Backend> DifferentiableAllToAll<B> {
    pub fn new(inner: Arc<dyn TokenAllToAll<B>>) -> Self {
        DifferentiableAllToAll { inner }
    }
}

fn float<B: Backend>(t: FloatTensor<B>) -> Tensor<B, 2> {
    Tensor::from_primitive(TensorPrimitive::Float(t))
}

#[derive(Debug)]
struct AllToAllBackward;

impl<B: Backend> Backward<B, 1> for AllToAllBackward {
    /// The exchange and the forward's `(send, recv)` splits.
    type State = (Arc<dyn TokenAllToAll<B>>, Vec<usize>, Vec<usize>);

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let [node] = ops.parents;
        let (exchange, send, recv) = ops.state;
        let dy = grads.consume::<B>(&ops.node);
        // Every rank issues the backward exchange, tracked input or not: a peer waits for it.
        // Sizes were checked in forward; a failing collective has raised the rank's fault
        // (the peers end with it), so this rank ends here too.
        let dx = exchange
            .all_to_all(float::<B>(dy), &recv, &send)
            .expect("the token all-to-all's backward exchange");
        if let Some(node) = node {
            grads.register::<B>(node.id, dx.into_primitive().tensor());
        }
    }
}

impl<B: Backend, C: CheckpointStrategy> TokenAllToAll<Autodiff<B, C>> for DifferentiableAllToAll<B> {
    fn ep_rank(&self) -> usize {
        self.inner.ep_rank()
    }

    fn ep_size(&self) -> usize {
        self.inner.ep_size()
    }

    fn gather_counts(&self, counts: Tensor<Autodiff<B, C>, 1, Int>) -> Result<Vec<usize>> {
        self.inner.gather_counts(counts.inner())
    }

    fn all_to_all(&self, rows: Tensor<Autodiff<B, C>, 2>, send: &[usize], recv: &[usize]) -> Result<Tensor<Autodiff<B, C>, 2>> {
        let rows = rows.into_primitive().tensor();
        let out = self
            .inner
            .all_to_all(float::<B>(rows.primitive.clone()), send, recv)?
            .into_primitive()
            .tensor();
        // Tracked when the rows need a gradient: the same on every rank (the same model), so
        // either every rank runs the backward exchange or none does.
        let out = match AllToAllBackward.prepare::<C>([rows.node.clone()]).compute_bound().stateful() {
            OpsKind::Tracked(prep) => prep.finish((self.inner.clone(), send.to_vec(), recv.to_vec()), out),
            OpsKind::UnTracked(prep) => prep.finish(out),
        };
        Ok(Tensor::from_primitive(TensorPrimitive::Float(out)))
    }
}
