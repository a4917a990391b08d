//! Attention's causal softmax as one differentiable op: one pass forward and one backward
//! (`AttentionOps::attention_causal_softmax`, the CubeCL `softmax` kernels on CubeCL backends), where
//! Burn's attention builds the causal mask from two aranges and runs the scale, mask fill, max,
//! subtract, exp, sum and divide as separate launches, and autodiff records each for backward.
//! The scores are `x [rows, seq]`: whole `[seq, seq]` blocks of query rows, row r the query at
//! position `r % seq`, which sees keys `0..=r % seq`.

use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::Autodiff;
use burn::tensor::ops::FloatTensor;

use crate::backend::ops::attention::check_scores;
pub use crate::backend::ops::attention::{causal_softmax_backward_reference, causal_softmax_reference};
use crate::backend::LowpBackend;
use crate::error::Result;

/// The causal softmax of `scale · x` for scores `x [rows, seq]`, no autodiff.
pub fn causal_softmax_rows<B: LowpBackend>(x: FloatTensor<B>, scale: f32) -> Result<FloatTensor<B>> {
    check_scores::<B>(&x)?;
    B::attention_causal_softmax(x, scale)
}

#[derive(Debug)]
struct CausalSoftmaxBackward;

impl<B: LowpBackend> Backward<B, 1> for CausalSoftmaxBackward {
    /// The op's output and the scale.
    type State = (FloatTensor<B>, f32);

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let [node] = ops.parents;
        let (p, scale) = ops.state;
        let dp = grads.consume::<B>(&ops.node);
        if let Some(node) = node {
            // Shapes were checked in forward; a failure here is a bug, not user input.
            let dx = B::attention_causal_softmax_backward(p, dp, scale).expect("causal softmax backward");
            grads.register::<B>(node.id, dx);
        }
    }
}

/// `causal_softmax_rows` on `Autodiff<B>`: keeps its output (not x) for backward.
pub fn causal_softmax_rows_autodiff<B: LowpBackend, C: CheckpointStrategy>(
    x: FloatTensor<Autodiff<B, C>>,
    scale: f32,
) -> Result<FloatTensor<Autodiff<B, C>>> {
    let p = causal_softmax_rows::<B>(x.primitive.clone(), scale)?;
    Ok(
        match CausalSoftmaxBackward.prepare::<C>([x.node.clone()]).compute_bound().stateful() {
            OpsKind::Tracked(prep) => prep.finish((p.clone(), scale), p),
            OpsKind::UnTracked(prep) => prep.finish(p),
        },
    )
}
