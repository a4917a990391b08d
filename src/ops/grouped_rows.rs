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
use burn::tensor::ops::FloatTensor;

pub use crate::backend::grouped::RowMove;
pub use crate::backend::ops::grouped::{add_selected_bias, move_rows, select_rows_or_zero};
use crate::backend::{GroupLayout, LowpBackend};

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
