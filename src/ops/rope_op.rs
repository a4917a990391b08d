//! Rotary position embedding (RoPE) as Burn's `RotaryEncoding::forward` computes it, as one
//! differentiable op: one pass forward and one backward (`LowpBackend::lowp_rope`, the CubeCL
//! `rope` kernel on CubeCL backends). Burn's version uploads a sign matrix, multiplies every
//! pair by it (a matmul), multiplies by the frequencies and sums, forward, and runs the matmul's
//! and the products' gradients backward. The frequencies are a constant: they get no gradient.

use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::Autodiff;
use burn::tensor::ops::FloatTensor;
use burn::tensor::{FloatDType, Tensor, TensorMetadata, TensorPrimitive};

pub use crate::backend::attention::RopePositions;
use crate::backend::LowpBackend;
use crate::error::{LowpError, Result};

/// Checks `x [rows, head]` and `freq [max_seq, head, 2]` against `positions`; the table's length.
pub(crate) fn check_rope<B: LowpBackend>(
    x: &FloatTensor<B>,
    freq: &FloatTensor<B>,
    positions: RopePositions,
) -> Result<usize> {
    let (xs, fs) = (x.shape().as_slice().to_vec(), freq.shape().as_slice().to_vec());
    let RopePositions { seq, start } = positions;
    let ok = xs.len() == 2
        && fs.len() == 3
        && fs[1] == xs[1]
        && fs[2] == 2
        && xs[1] % 2 == 0
        && seq > 0
        && xs[0] % seq == 0
        && start + seq <= fs[0];
    if !ok {
        return Err(LowpError::shape(
            "RoPE input",
            format!("x {xs:?}, frequencies {fs:?}, sequence length {seq} from position {start}"),
            "x is [rows, head] with an even head and whole sequences of rows, the frequencies \
             [max_seq, head, 2] with start + seq <= max_seq",
        ));
    }
    Ok(fs[0])
}

/// The reference of `LowpBackend::lowp_rope` with Burn ops, in f32 (the default for backends
/// without the kernel). On f32 inputs it equals Burn's `RotaryEncoding` bit for bit: its sign
/// matmul only copies and negates, and its sum of two products is the same difference.
pub fn rope_reference<B: LowpBackend>(
    x: FloatTensor<B>,
    freq: FloatTensor<B>,
    positions: RopePositions,
    inverse: bool,
) -> Result<FloatTensor<B>> {
    check_rope::<B>(&x, &freq, positions)?;
    let RopePositions { seq, start } = positions;
    let x: Tensor<B, 2> = Tensor::from_primitive(TensorPrimitive::Float(x));
    let dtype = x.dtype();
    let [rows, head] = x.dims();
    let pairs = x.cast(FloatDType::F32).reshape([rows / seq, seq, head / 2, 2]);
    let (a, b) = (pairs.clone().narrow(3, 0, 1), pairs.narrow(3, 1, 1));
    let freq: Tensor<B, 3> = Tensor::from_primitive(TensorPrimitive::Float(freq));
    // [seq, head / 2, (element of the pair), (cos, sin)]
    let f = freq
        .cast(FloatDType::F32)
        .slice([start..start + seq])
        .reshape([1, seq, head / 2, 4]);
    let part = |i: usize| f.clone().narrow(3, i, 1);
    let (cos0, sin0, cos1, sin1) = (part(0), part(1), part(2), part(3));
    let (ya, yb) = if inverse {
        (a.clone() * cos0 + b.clone() * sin1, b * cos1 - a * sin0)
    } else {
        (a.clone() * cos0 - b.clone() * sin0, b * cos1 + a * sin1)
    };
    let y = Tensor::cat(vec![ya, yb], 3).reshape([rows, head]).cast(dtype);
    Ok(y.into_primitive().tensor())
}

/// RoPE of `x [rows, head]`, no autodiff.
pub fn rope_rows<B: LowpBackend>(
    x: FloatTensor<B>,
    freq: FloatTensor<B>,
    positions: RopePositions,
) -> Result<FloatTensor<B>> {
    check_rope::<B>(&x, &freq, positions)?;
    B::lowp_rope(x, freq, positions, false)
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
            let dx = B::lowp_rope(dy, freq, positions, true).expect("RoPE backward");
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
