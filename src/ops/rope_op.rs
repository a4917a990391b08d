//! Rotary position embedding (RoPE) as Burn's `RotaryEncoding::forward` computes it, as one
//! differentiable op: one pass forward and one backward (`AttentionOps::attention_rope`, the CubeCL
//! `rope` kernel on CubeCL backends). Burn's version uploads a sign matrix, multiplies every
//! pair by it (a matmul), multiplies by the frequencies and sums, forward, and runs the matmul's
//! and the products' gradients backward. The frequencies are a constant: they get no gradient.

use burn::tensor::ops::FloatTensor;

pub use crate::backend::attention::RopePositions;
use crate::backend::ops::attention::check_rope;
pub use crate::backend::ops::attention::rope_reference;
use super::differentiable::DifferentiableOp;
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

/// RoPE as a differentiable op (`LowpLinear::lowp_differentiable`): the frequencies are a
/// constant of the op (no gradient); backward rotates the output's gradient back, keeping only
/// the frequencies.
#[derive(Debug)]
pub struct RopeOp<B: LowpBackend> {
    pub freq: FloatTensor<B>,
    pub positions: RopePositions,
}

impl<B: LowpBackend> DifferentiableOp<B, 1> for RopeOp<B> {
    type State = (FloatTensor<B>, RopePositions);

    fn forward(self, [x]: [FloatTensor<B>; 1], _: [bool; 1]) -> Result<(FloatTensor<B>, Self::State)> {
        let y = rope_rows::<B>(x, self.freq.clone(), self.positions)?;
        Ok((y, (self.freq, self.positions)))
    }

    fn backward(
        (freq, positions): Self::State,
        dy: FloatTensor<B>,
        [wanted]: [bool; 1],
    ) -> [Option<FloatTensor<B>>; 1] {
        [wanted.then(|| B::attention_rope(dy, freq, positions, true).expect("RoPE backward"))]
    }
}
