//! Moving token rows between the packed layout (`[tokens, cols]`, group after group) and the
//! aligned layout grouped GEMMs take (`[rows, cols]`, each group at a multiple of 128 rows, zero
//! padding; `backend::grouped::GroupLayout`). Each is a gather whose backward is the opposite
//! gather (no scatter): padding rows read a zero row. (Each group's bias is added by the grouped
//! linear op, `ops/grouped_linear.rs`, whose backward reads dY once for its gradient.)

use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::Autodiff;
use burn::tensor::ops::{FloatTensor, IntTensor};
use burn::tensor::{Int, Tensor, TensorCreationOptions, TensorPrimitive};

pub use crate::backend::grouped::RowMove;
use crate::backend::{GroupLayout, LowpBackend};

fn tensor<B: LowpBackend>(t: FloatTensor<B>) -> Tensor<B, 2> {
    Tensor::from_primitive(TensorPrimitive::Float(t))
}

/// `t` with one zero row appended (what padding rows and the tail read).
fn with_zero_row<B: LowpBackend>(t: Tensor<B, 2>) -> Tensor<B, 2> {
    let [_, cols] = t.dims();
    let zero = Tensor::zeros(
        [1, cols],
        TensorCreationOptions::new(t.device()).with_dtype(t.dtype()),
    );
    Tensor::cat(vec![t, zero], 0)
}

/// `LowpBackend::lowp_gather_rows` in Burn tensor ops: `t` with a zero row appended, then
/// `select` (the default for backends without a row-gather kernel).
/// Indices past the end read the zero row.
pub fn select_rows_or_zero<B: LowpBackend>(t: FloatTensor<B>, index: IntTensor<B>) -> FloatTensor<B> {
    let t = tensor::<B>(t);
    let rows = t.dims()[0];
    let index = Tensor::<B, 1, Int>::from_primitive(index).clamp_max(rows as i64);
    with_zero_row(t).select(0, index).into_primitive().tensor()
}

/// Moves rows of `t` (any backend, no autodiff of its own).
pub fn move_rows<B: LowpBackend>(
    t: FloatTensor<B>,
    layout: &GroupLayout<B>,
    direction: RowMove,
) -> FloatTensor<B> {
    match direction {
        // Aligned row r reads packed token aligned_to_packed[r] (`tokens`: a zero row).
        RowMove::Pad => B::lowp_gather_rows(t, layout.aligned_to_packed.clone()),
        RowMove::Unpad => B::lowp_gather_rows(t, layout.packed_to_aligned.clone()),
    }
}

/// The bias add of `LowpBackend::lowp_group_epilogue` in Burn tensor ops: the per-row bias matrix (a zero row
/// for groups past the bias's rows), then an add.
pub fn add_selected_bias<B: LowpBackend>(
    y: FloatTensor<B>,
    bias: FloatTensor<B>,
    row_group: IntTensor<B>,
) -> FloatTensor<B> {
    let rows_bias = tensor::<B>(select_rows_or_zero::<B>(bias, row_group));
    (tensor::<B>(y) + rows_bias).into_primitive().tensor()
}

#[derive(Debug)]
struct MoveRowsBackward;

impl<B: LowpBackend> Backward<B, 1> for MoveRowsBackward {
    type State = (GroupLayout<B>, RowMove);

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let [node] = ops.parents;
        let (layout, direction) = ops.state;
        let grad = grads.consume::<B>(&ops.node);
        if let Some(node) = node {
            grads.register::<B>(node.id, move_rows::<B>(grad, &layout, direction.reverse()));
        }
    }
}

/// `move_rows` on `Autodiff<B>`: the gradient moves back the other way.
pub fn move_rows_autodiff<B: LowpBackend, C: CheckpointStrategy>(
    t: FloatTensor<Autodiff<B, C>>,
    layout: &GroupLayout<B>,
    direction: RowMove,
) -> FloatTensor<Autodiff<B, C>> {
    let out = move_rows::<B>(t.primitive.clone(), layout, direction);
    match MoveRowsBackward
        .prepare::<C>([t.node.clone()])
        // Compute-bound in Burn's checkpointing sense: keep the output, never recompute it.
        .compute_bound()
        .stateful()
    {
        OpsKind::Tracked(prep) => prep.finish((layout.clone(), direction), out),
        OpsKind::UnTracked(prep) => prep.finish(out),
    }
}
