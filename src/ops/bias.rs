//! Adding a bias row `b [N]` to `Y [M, N]`, with a backward whose bias gradient (`Σ_rows dY`)
//! runs at memory speed.
//!
//! Burn's own backward of `y + b.unsqueeze()` reduces dY along its rows with `sum_dim(0)`, whose
//! CubeCL kernel gets one thread per group of columns: on an H100 it took 1.86 ms for an
//! 8192x8192 BF16 dY (about 70 GB/s), longer than the FP8 GEMMs of the same Linear step.
//! `column_sum` first sums blocks of 256 rows (as many threads as (block, column) pairs), then
//! the block sums. Each stage accumulates in f32 and rounds to dY's dtype, so a BF16 bias
//! gradient is rounded twice instead of once (documented in the tests' tolerances).

use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops};
use burn::backend::Autodiff;
use burn::tensor::backend::Backend;
use burn::tensor::ops::FloatTensor;
use burn::tensor::{Tensor, TensorPrimitive};

/// Rows summed per block in the first stage of `column_sum`.
const BLOCK_ROWS: usize = 256;

fn tensor<B: Backend, const D: usize>(t: FloatTensor<B>) -> Tensor<B, D> {
    Tensor::from_primitive(TensorPrimitive::Float(t))
}

/// `Σ_rows t` of a `[rows, cols]` tensor, as `[cols]`.
pub fn column_sum<B: Backend>(t: FloatTensor<B>) -> FloatTensor<B> {
    let t = tensor::<B, 2>(t);
    let [rows, cols] = t.dims();
    let head = rows / BLOCK_ROWS * BLOCK_ROWS;
    let sums = if head >= 2 * BLOCK_ROWS {
        let blocks = t
            .clone()
            .slice([0..head, 0..cols])
            .reshape([head / BLOCK_ROWS, BLOCK_ROWS, cols])
            .sum_dim(1)
            .reshape([head / BLOCK_ROWS, cols])
            .sum_dim(0);
        if head < rows {
            blocks + t.slice([head..rows, 0..cols]).sum_dim(0)
        } else {
            blocks
        }
    } else {
        t.sum_dim(0)
    };
    sums.reshape([cols]).into_primitive().tensor()
}

/// `y + bias` broadcast over rows, on any backend (no autodiff of its own).
pub fn add_bias_rows<B: Backend>(y: FloatTensor<B>, bias: FloatTensor<B>) -> FloatTensor<B> {
    (tensor::<B, 2>(y) + tensor::<B, 1>(bias).unsqueeze::<2>())
        .into_primitive()
        .tensor()
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
