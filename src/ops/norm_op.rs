//! Row normalization (RMSNorm, or LayerNorm without `β`, of `x [rows, cols]` with `γ`) as one
//! differentiable op: one pass forward (`NormOps::norm_forward`, which keeps the
//! per-row f32 `mean` / `rstd`) and one backward (`norm_backward`: dx and f32 dγ), the
//! CubeCL norm kernels on CubeCL backends. Burn's `RmsNorm` built from tensor ops launches about 7
//! kernels forward and twice that backward; a model with 17 norms per micro-batch (the MoE
//! example) pays that launch cost on the host every step.
//!
//! `γ` may be stored in another dtype than `x` (an f32 norm weight on BF16 activations): it is
//! cast to x's dtype for the kernels, and its gradient back to its own dtype. (LayerNorm's `β`
//! is fused into `LayerNormLinear` / `LayerNormMLP`, not taken here.)

use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::Autodiff;
use burn::tensor::ops::FloatTensor;
use burn::tensor::{FloatDType, TensorMetadata};

use crate::backend::NormSpec;
use crate::backend::LowpBackend;
use super::lowp_linear::gemm_dtype;
use crate::error::{LowpError, Result};


fn check_shapes<B: LowpBackend>(x: &FloatTensor<B>, gamma: &FloatTensor<B>) -> Result<()> {
    let xs = x.shape().as_slice().to_vec();
    let gs = gamma.shape().as_slice().to_vec();
    if xs.len() != 2 {
        return Err(LowpError::shape("norm input", format!("{xs:?}"), "must be [rows, cols]"));
    }
    if gs != [xs[1]] {
        return Err(LowpError::shape(
            "norm weight",
            format!("{gs:?}"),
            format!("must be [cols] = [{}] for input {xs:?}", xs[1]),
        ));
    }
    Ok(())
}

/// The forward pass on a backend without autodiff: `y` in x's dtype, and what backward keeps.
fn forward<B: LowpBackend>(
    x: FloatTensor<B>,
    gamma: FloatTensor<B>,
    spec: &NormSpec,
) -> Result<(FloatTensor<B>, NormSaved<B>)> {
    check_shapes::<B>(&x, &gamma)?;
    let x_dtype = gemm_dtype(x.dtype());
    let weight_dtype = gemm_dtype(gamma.dtype());
    let gamma = B::float_cast(gamma, x_dtype);
    let r = B::norm_forward(x.clone(), gamma.clone(), None, spec, false)?;
    let saved = NormSaved {
        spec: *spec,
        x,
        gamma,
        mean: r.mean,
        rstd: r.rstd,
        weight_dtype,
    };
    Ok((r.y, saved))
}

/// Normalizes the rows of `x [rows, cols]` (no autodiff).
pub fn norm_rows<B: LowpBackend>(
    x: FloatTensor<B>,
    gamma: FloatTensor<B>,
    spec: &NormSpec,
) -> Result<FloatTensor<B>> {
    forward::<B>(x, gamma, spec).map(|(y, _)| y)
}

/// What backward needs: the input, γ in x's dtype, the per-row statistics.
#[derive(Debug, Clone)]
struct NormSaved<B: LowpBackend> {
    spec: NormSpec,
    x: FloatTensor<B>,
    gamma: FloatTensor<B>,
    mean: FloatTensor<B>,
    rstd: FloatTensor<B>,
    weight_dtype: FloatDType,
}

#[derive(Debug)]
struct NormRowsBackward;

impl<B: LowpBackend> Backward<B, 2> for NormRowsBackward {
    type State = NormSaved<B>;

    fn backward(self, ops: Ops<Self::State, 2>, grads: &mut Gradients, _: &mut Checkpointer) {
        let [node_x, node_gamma] = ops.parents;
        let s = ops.state;
        let dy = grads.consume::<B>(&ops.node);
        let dy = B::float_cast(dy, gemm_dtype(s.x.dtype()));
        // Shapes and dtypes were checked in forward; a failure here is a bug, not user input.
        let nb = B::norm_backward(dy, s.x, s.gamma, s.mean, s.rstd, &s.spec, false)
            .expect("norm backward");
        if let Some(node) = node_x {
            grads.register::<B>(node.id, nb.dx);
        }
        if let Some(node) = node_gamma {
            grads.register::<B>(node.id, B::float_cast(nb.dgamma, s.weight_dtype));
        }
    }
}

/// `norm_rows` on `Autodiff<B>`: the backward pass is `norm_backward`. The forward output
/// is kept (compute-bound in Burn's checkpointing sense), never recomputed.
pub fn norm_rows_autodiff<B: LowpBackend, C: CheckpointStrategy>(
    x: FloatTensor<Autodiff<B, C>>,
    gamma: FloatTensor<Autodiff<B, C>>,
    spec: &NormSpec,
) -> Result<FloatTensor<Autodiff<B, C>>> {
    let (y, saved) = forward::<B>(x.primitive.clone(), gamma.primitive.clone(), spec)?;
    let parents = [x.node.clone(), gamma.node.clone()];
    Ok(
        match NormRowsBackward.prepare::<C>(parents).compute_bound().stateful() {
            OpsKind::Tracked(prep) => prep.finish(saved, y),
            OpsKind::UnTracked(prep) => prep.finish(y),
        },
    )
}
