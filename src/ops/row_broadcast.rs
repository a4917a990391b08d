//! Ops that broadcast a row vector over the rows of a matrix (a bias `Y + b`, LayerNorm's
//! `X · γ`), with backward passes whose vector gradients (`Σ_rows ...`) run at memory speed
//! (`backend::ops::rows`) rather than through Burn's backward of a broadcast, whose `sum_dim(0)`
//! took longer than the FP8 GEMMs of an 8192x8192 Linear step.

use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::Autodiff;
use burn::tensor::backend::Backend;
use burn::tensor::ops::FloatTensor;
use burn::tensor::{Tensor, TensorPrimitive};

pub use crate::backend::ops::rows::{add_bias_rows, column_sum};

fn tensor<B: Backend, const D: usize>(t: FloatTensor<B>) -> Tensor<B, D> {
    Tensor::from_primitive(TensorPrimitive::Float(t))
}

#[derive(Debug)]
struct AddBiasBackward;

impl<B: Backend> Backward<B, 2> for AddBiasBackward {
    type State = ();

    fn backward(self, ops: Ops<Self::State, 2>, grads: &mut Gradients, _: &mut Checkpointer) {
        let [node_y, node_bias] = ops.parents;
        let dy = grads.consume::<B>(&ops.node);
        if let Some(node) = node_bias {
            grads.register::<B>(node.id, column_sum::<B>(dy.clone()));
        }
        if let Some(node) = node_y {
            grads.register::<B>(node.id, dy);
        }
    }
}

/// `y + bias` on `Autodiff<B>`, with `column_sum` for the bias gradient.
pub fn add_bias_rows_autodiff<B: Backend, C: CheckpointStrategy>(
    y: FloatTensor<Autodiff<B, C>>,
    bias: FloatTensor<Autodiff<B, C>>,
) -> FloatTensor<Autodiff<B, C>> {
    let out = add_bias_rows::<B>(y.primitive.clone(), bias.primitive.clone());
    AddBiasBackward
        .prepare::<C>([y.node.clone(), bias.node.clone()])
        // Compute-bound in Burn's checkpointing sense: keep the output, never recompute it.
        .compute_bound()
        .stateless(out)
}

/// `x * gamma` broadcast over rows, on any backend (no autodiff of its own).
pub fn mul_rows<B: Backend>(x: FloatTensor<B>, gamma: FloatTensor<B>) -> FloatTensor<B> {
    (tensor::<B, 2>(x) * tensor::<B, 1>(gamma).unsqueeze::<2>())
        .into_primitive()
        .tensor()
}

#[derive(Debug)]
struct MulRowsBackward;

impl<B: Backend> Backward<B, 2> for MulRowsBackward {
    /// The inputs `x` and `gamma` (each only when the other's gradient needs it).
    type State = (Option<FloatTensor<B>>, Option<FloatTensor<B>>);

    fn backward(self, ops: Ops<Self::State, 2>, grads: &mut Gradients, _: &mut Checkpointer) {
        let [node_x, node_gamma] = ops.parents;
        let (x, gamma) = ops.state;
        let dy = grads.consume::<B>(&ops.node);
        if let (Some(node), Some(x)) = (node_gamma, x) {
            let product = (tensor::<B, 2>(dy.clone()) * tensor::<B, 2>(x))
                .into_primitive()
                .tensor();
            grads.register::<B>(node.id, column_sum::<B>(product));
        }
        if let (Some(node), Some(gamma)) = (node_x, gamma) {
            grads.register::<B>(node.id, mul_rows::<B>(dy, gamma));
        }
    }
}

/// `x * gamma` on `Autodiff<B>`, with `column_sum` for gamma's gradient.
pub fn mul_rows_autodiff<B: Backend, C: CheckpointStrategy>(
    x: FloatTensor<Autodiff<B, C>>,
    gamma: FloatTensor<Autodiff<B, C>>,
) -> FloatTensor<Autodiff<B, C>> {
    let out = mul_rows::<B>(x.primitive.clone(), gamma.primitive.clone());
    let (need_dx, need_dgamma) = (x.is_tracked(), gamma.is_tracked());
    match MulRowsBackward
        .prepare::<C>([x.node.clone(), gamma.node.clone()])
        .compute_bound()
        .stateful()
    {
        OpsKind::Tracked(prep) => prep.finish(
            (
                need_dgamma.then(|| x.primitive.clone()),
                need_dx.then(|| gamma.primitive.clone()),
            ),
            out,
        ),
        OpsKind::UnTracked(prep) => prep.finish(out),
    }
}
