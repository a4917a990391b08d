//! Batched matrix products `C[i] = op(A[i]) · op(B[i])` as one differentiable op whose backward
//! runs the same product with transpose flags (`GemmOps::gemm_batched`): cuBLASLt's
//! strided batch on CUDA, Burn's matmul elsewhere. Attention's `Q·Kᵀ` and `P·V`, the router's
//! f32 logits and the tied LM head use it: Burn's CubeCL matmul ran them at 10-20 TFLOP/s on an
//! H100 (`[256, 256, 64]` per head, N = 8 router columns), a sixth of the MoE step's GPU time.
//! A transposed operand is passed as stored (`[batch, k, m]` for `Aᵀ`), so neither direction
//! copies a transpose.

use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::Autodiff;
use burn::tensor::ops::FloatTensor;
use burn::tensor::TensorMetadata;

pub use crate::backend::gemm::{batched_dims, Transposes};
pub use crate::backend::ops::gemm::batched_matmul_reference;
use crate::backend::LowpBackend;
use crate::error::{LowpError, Result};

/// `op(a) · op(b)` for rank-3 `a`, `b` of one float dtype.
pub fn batched_matmul<B: LowpBackend>(
    a: FloatTensor<B>,
    b: FloatTensor<B>,
    t: Transposes,
) -> Result<FloatTensor<B>> {
    batched_dims(&a.shape(), &b.shape(), t)?;
    if a.dtype() != b.dtype() {
        return Err(LowpError::invalid(
            "batched matmul operands",
            format!("{:?} and {:?}", a.dtype(), b.dtype()),
            "both operands have one float dtype",
        ));
    }
    B::gemm_batched(a, b, t)
}

/// The product again, in backward: shapes were checked in forward, so a failure is a bug.
fn product<B: LowpBackend>(x: FloatTensor<B>, y: FloatTensor<B>, a: bool, b: bool) -> FloatTensor<B> {
    batched_matmul::<B>(x, y, Transposes { a, b }).expect("batched matmul backward")
}

/// `dA` of `C = op(A) · op(B)` from B and dC, as the same product with other flags.
pub(crate) fn grad_a<B: LowpBackend>(b: FloatTensor<B>, dc: FloatTensor<B>, t: Transposes) -> FloatTensor<B> {
    match (t.a, t.b) {
        (false, false) => product::<B>(dc, b, false, true), // dC·Bᵀ
        (false, true) => product::<B>(dc, b, false, false), // dC·B
        (true, false) => product::<B>(b, dc, false, true),  // B·dCᵀ
        (true, true) => product::<B>(b, dc, true, true),    // Bᵀ·dCᵀ
    }
}

/// `dB` of `C = op(A) · op(B)` from A and dC.
pub(crate) fn grad_b<B: LowpBackend>(a: FloatTensor<B>, dc: FloatTensor<B>, t: Transposes) -> FloatTensor<B> {
    match (t.a, t.b) {
        (false, false) => product::<B>(a, dc, true, false), // Aᵀ·dC
        (false, true) => product::<B>(dc, a, true, false),  // dCᵀ·A
        (true, false) => product::<B>(a, dc, false, false), // A·dC
        (true, true) => product::<B>(dc, a, true, true),    // dCᵀ·Aᵀ
    }
}

#[derive(Debug)]
struct BatchedMatmulBackward;

impl<B: LowpBackend> Backward<B, 2> for BatchedMatmulBackward {
    /// A (kept when B's gradient is wanted), B (kept when A's is) and the flags.
    type State = (Option<FloatTensor<B>>, Option<FloatTensor<B>>, Transposes);

    fn backward(self, ops: Ops<Self::State, 2>, grads: &mut Gradients, _: &mut Checkpointer) {
        let [node_a, node_b] = ops.parents;
        let (a, b, t) = ops.state;
        let dc = grads.consume::<B>(&ops.node);
        if let (Some(node), Some(b)) = (node_a, b) {
            grads.register::<B>(node.id, grad_a::<B>(b, dc.clone(), t));
        }
        if let (Some(node), Some(a)) = (node_b, a) {
            grads.register::<B>(node.id, grad_b::<B>(a, dc, t));
        }
    }
}

/// `batched_matmul` on `Autodiff<B>`.
pub fn batched_matmul_autodiff<B: LowpBackend, C: CheckpointStrategy>(
    a: FloatTensor<Autodiff<B, C>>,
    b: FloatTensor<Autodiff<B, C>>,
    t: Transposes,
) -> Result<FloatTensor<Autodiff<B, C>>> {
    let c = batched_matmul::<B>(a.primitive.clone(), b.primitive.clone(), t)?;
    let keep_a = b.is_tracked().then(|| a.primitive.clone());
    let keep_b = a.is_tracked().then(|| b.primitive.clone());
    Ok(
        match BatchedMatmulBackward
            .prepare::<C>([a.node.clone(), b.node.clone()])
            .compute_bound()
            .stateful()
        {
            OpsKind::Tracked(prep) => prep.finish((keep_a, keep_b, t), c),
            OpsKind::UnTracked(prep) => prep.finish(c),
        },
    )
}
