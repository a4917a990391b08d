//! Attention's causal softmax as one differentiable op: one pass forward and one backward
//! (`AttentionOps::attention_causal_softmax`, the CubeCL `softmax` kernels on CubeCL backends),
//! where Burn's attention builds the causal mask from two aranges and runs the scale, mask fill,
//! max, subtract, exp, sum and divide as separate launches, and autodiff records each for backward.
//! The scores are `x [rows, seq]`: whole `[seq, seq]` blocks of query rows, row r the query at
//! position `r % seq`, which sees keys `0..=r % seq`.

use burn::tensor::ops::FloatTensor;

use crate::backend::ops::attention::check_scores;
pub use crate::backend::ops::attention::{causal_softmax_backward_reference, causal_softmax_reference};
use super::differentiable::DifferentiableOp;
use crate::backend::LowpBackend;
use crate::error::Result;

/// The causal softmax of `scale · x` for scores `x [rows, seq]`, no autodiff.
pub fn causal_softmax_rows<B: LowpBackend>(x: FloatTensor<B>, scale: f32) -> Result<FloatTensor<B>> {
    check_scores::<B>(&x)?;
    B::attention_causal_softmax(x, scale)
}

/// The causal softmax of `scale · x` as a differentiable op (`LowpLinear::lowp_differentiable`):
/// backward keeps its output (not x).
#[derive(Debug)]
pub struct CausalSoftmaxOp {
    pub scale: f32,
}

impl<B: LowpBackend> DifferentiableOp<B, 1> for CausalSoftmaxOp {
    /// The op's output and the scale.
    type State = (FloatTensor<B>, f32);

    fn forward(self, [x]: [FloatTensor<B>; 1], _: [bool; 1]) -> Result<(FloatTensor<B>, Self::State)> {
        let p = causal_softmax_rows::<B>(x, self.scale)?;
        Ok((p.clone(), (p, self.scale)))
    }

    fn backward(
        (p, scale): Self::State,
        dp: FloatTensor<B>,
        [wanted]: [bool; 1],
    ) -> [Option<FloatTensor<B>>; 1] {
        [wanted.then(|| {
            B::attention_causal_softmax_backward(p, dp, scale).expect("causal softmax backward")
        })]
    }
}
