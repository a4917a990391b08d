//! Rotary position embedding (RoPE) as Burn's `RotaryEncoding::forward` computes it, as one
//! differentiable op: one pass forward and one backward (`AttentionOps::attention_rope`, the CubeCL
//! `rope` kernel on CubeCL backends). Burn's version uploads a sign matrix, multiplies every
//! pair by it (a matmul), multiplies by the frequencies and sums, forward, and runs the matmul's
//! and the products' gradients backward. The frequencies are a constant: they get no gradient.

use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::Autodiff;
use burn::tensor::ops::FloatTensor;

pub use crate::backend::attention::RopePositions;
use crate::backend::ops::attention::check_rope;
pub use crate::backend::ops::attention::rope_reference;
use crate::backend::LowpBackend;
use crate::error::Result;

/// RoPE of `x [rows, head]`, no autodiff.
pub fn rope_rows<B: LowpBackend>(
    x: FloatTensor<B>,
    freq: FloatTensor<B>,
    positions: RopePositions,
) -> Result<FloatTensor<B>> {
    check_rope::<B>(&x, &freq, positions)?;
    B::attention_rope(x, freq, positions, false)
}

#[derive(Debug)]
struct RopeBackward;

impl<B: LowpBackend> Backward<B, 1> for RopeBackward {
    type State = (FloatTensor<B>, RopePositions);

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let [node] = ops.parents;
        let (freq, positions) = ops.state;
        let dy = grads.consume::<B>(&ops.node);
        if let Some(node) = node {
            // Shapes were checked in forward; a failure here is a bug, not user input.
            let dx = B::attention_rope(dy, freq, positions, true).expect("RoPE backward");
            grads.register::<B>(node.id, dx);
        }
    }
}

/// `rope_rows` on `Autodiff<B>`: keeps the frequencies (not x) for backward.
pub fn rope_rows_autodiff<B: LowpBackend, C: CheckpointStrategy>(
    x: FloatTensor<Autodiff<B, C>>,
    freq: FloatTensor<Autodiff<B, C>>,
    positions: RopePositions,
) -> Result<FloatTensor<Autodiff<B, C>>> {
    let y = rope_rows::<B>(x.primitive.clone(), freq.primitive.clone(), positions)?;
    Ok(
        match RopeBackward.prepare::<C>([x.node.clone()]).compute_bound().stateful() {
            OpsKind::Tracked(prep) => prep.finish((freq.primitive, positions), y),
            OpsKind::UnTracked(prep) => prep.finish(y),
        },
    )
}
