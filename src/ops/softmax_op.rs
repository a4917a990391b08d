//! Attention's causal softmax as one differentiable op: one pass forward and one backward
//! (`LowpBackend::lowp_causal_softmax`, the CubeCL `softmax` kernels on CubeCL backends), where
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
use burn::tensor::{Bool, FloatDType, Int, Tensor, TensorMetadata, TensorPrimitive};

use crate::backend::LowpBackend;
use crate::error::{LowpError, Result};

/// Checks scores `x [rows, seq]` (whole `[seq, seq]` blocks); `(rows, seq)`.
pub(crate) fn check_scores<B: LowpBackend>(x: &FloatTensor<B>) -> Result<(usize, usize)> {
    let dims = x.shape().as_slice().to_vec();
    match dims.as_slice() {
        [rows, seq] if *seq > 0 && rows % seq == 0 => Ok((*rows, *seq)),
        _ => Err(LowpError::shape(
            "attention scores",
            format!("{dims:?}"),
            "causal softmax takes [rows, seq] scores made of whole [seq, seq] blocks of query rows",
        )),
    }
}

fn float<B: LowpBackend>(t: FloatTensor<B>) -> Tensor<B, 2> {
    Tensor::from_primitive(TensorPrimitive::Float(t))
}

/// `[seq, seq]` true where a query (row) must not see a key (column): the key comes later.
fn future_keys<B: LowpBackend>(seq: usize, device: &B::Device) -> Tensor<B, 2, Bool> {
    let positions = Tensor::<B, 1, Int>::arange(0..seq as i64, device);
    let queries = positions.clone().reshape([seq, 1]).expand([seq, seq]);
    let keys = positions.reshape([1, seq]).expand([seq, seq]);
    queries.lower(keys)
}

/// The reference of `LowpBackend::lowp_causal_softmax` with Burn ops in f32 (the default for
/// backends without the kernel), rounded to x's dtype once.
pub fn causal_softmax_reference<B: LowpBackend>(x: FloatTensor<B>, scale: f32) -> Result<FloatTensor<B>> {
    let (rows, seq) = check_scores::<B>(&x)?;
    let x = float::<B>(x);
    let (dtype, device) = (x.dtype(), x.device());
    let s = x.cast(FloatDType::F32).mul_scalar(scale).reshape([rows / seq, seq, seq]);
    let mask = future_keys::<B>(seq, &device).unsqueeze::<3>().expand([rows / seq, seq, seq]);
    let s = s.mask_fill(mask, f32::NEG_INFINITY);
    let e = (s.clone() - s.max_dim(2)).exp();
    let p = e.clone() / e.sum_dim(2);
    Ok(p.reshape([rows, seq]).cast(dtype).into_primitive().tensor())
}

/// The reference of `LowpBackend::lowp_causal_softmax_backward`: `scale · p · (dp - Σ p · dp)`
/// per row, in f32, rounded to p's dtype once.
pub fn causal_softmax_backward_reference<B: LowpBackend>(
    p: FloatTensor<B>,
    dp: FloatTensor<B>,
    scale: f32,
) -> Result<FloatTensor<B>> {
    check_scores::<B>(&p)?;
    let (p, dp) = (float::<B>(p), float::<B>(dp));
    let dtype = p.dtype();
    let (p, dp) = (p.cast(FloatDType::F32), dp.cast(FloatDType::F32));
    let dot = (p.clone() * dp.clone()).sum_dim(1);
    let dx = (p * (dp - dot)).mul_scalar(scale);
    Ok(dx.cast(dtype).into_primitive().tensor())
}

/// The causal softmax of `scale · x` for scores `x [rows, seq]`, no autodiff.
pub fn causal_softmax_rows<B: LowpBackend>(x: FloatTensor<B>, scale: f32) -> Result<FloatTensor<B>> {
    check_scores::<B>(&x)?;
    B::lowp_causal_softmax(x, scale)
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
            let dx = B::lowp_causal_softmax_backward(p, dp, scale).expect("causal softmax backward");
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
