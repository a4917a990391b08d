//! An activation of TE's set (`backend::activation`: gelu, swiglu, ...) on `h [rows, F']` as one
//! differentiable op: one pass forward (`ActivationOps::act_forward`; gated activations
//! read both halves of `h` and write `[rows, F' / 2]`) and one backward
//! (`act_backward`: `dh` from `dy` and `h`), the CubeCL activation kernels on CubeCL
//! backends. SwiGLU from Burn tensor ops is two slices, a sigmoid, two products forward and about
//! ten kernels backward (the slices' gradients are zero tensors with a slice written into each).

use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::Autodiff;
use burn::tensor::ops::FloatTensor;
use burn::tensor::TensorMetadata;

use crate::backend::activation::ActivationSpec;
use crate::backend::LowpBackend;
use crate::error::{LowpError, Result};

fn check<B: LowpBackend>(h: &FloatTensor<B>, spec: &ActivationSpec) -> Result<()> {
    spec.check()?;
    let dims = h.shape().as_slice().to_vec();
    if dims.len() != 2 {
        return Err(LowpError::shape(
            "activation input",
            format!("{dims:?}"),
            "must be [rows, cols]",
        ));
    }
    if spec.activation.is_gated() && dims[1] % 2 != 0 {
        return Err(LowpError::shape(
            "activation input",
            format!("{dims:?}"),
            format!("{} is gated: its input needs an even number of columns", spec.activation.name()),
        ));
    }
    Ok(())
}

/// `act(h)` (gated: `act(h[:, :F]) · h[:, F:]`), no autodiff.
pub fn activation_rows<B: LowpBackend>(
    h: FloatTensor<B>,
    spec: &ActivationSpec,
) -> Result<FloatTensor<B>> {
    check::<B>(&h, spec)?;
    Ok(B::act_forward(h, spec, false)?.y)
}

#[derive(Debug)]
struct ActivationRowsBackward;

impl<B: LowpBackend> Backward<B, 1> for ActivationRowsBackward {
    type State = (FloatTensor<B>, ActivationSpec);

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let [node] = ops.parents;
        let (h, spec) = ops.state;
        let dy = grads.consume::<B>(&ops.node);
        if let Some(node) = node {
            let dy = B::float_cast(dy, super::lowp_linear::gemm_dtype(h.dtype()));
            // Shapes were checked in forward; a failure here is a bug, not user input.
            let dh = B::act_backward(dy, h, &spec, false, false)
                .expect("activation backward")
                .y;
            grads.register::<B>(node.id, dh);
        }
    }
}

/// `activation_rows` on `Autodiff<B>`: keeps `h` for backward.
pub fn activation_rows_autodiff<B: LowpBackend, C: CheckpointStrategy>(
    h: FloatTensor<Autodiff<B, C>>,
    spec: &ActivationSpec,
) -> Result<FloatTensor<Autodiff<B, C>>> {
    let y = activation_rows::<B>(h.primitive.clone(), spec)?;
    Ok(
        match ActivationRowsBackward
            .prepare::<C>([h.node.clone()])
            .compute_bound()
            .stateful()
        {
            OpsKind::Tracked(prep) => prep.finish((h.primitive.clone(), *spec), y),
            OpsKind::UnTracked(prep) => prep.finish(y),
        },
    )
}
