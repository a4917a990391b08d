//! Batched matrix products `C[i] = op(A[i]) · op(B[i])` as one differentiable op whose backward
//! runs the same product with transpose flags (`GemmOps::gemm_batched`): cuBLASLt's
//! strided batch on CUDA, Burn's matmul elsewhere. Attention's `Q·Kᵀ` and `P·V`, the router's
//! f32 logits and the tied LM head use it: Burn's CubeCL matmul ran them at 10-20 TFLOP/s on an
//! H100 (`[256, 256, 64]` per head, N = 8 router columns), a sixth of the MoE step's GPU time.
//! A transposed operand is passed as stored (`[batch, k, m]` for `Aᵀ`), so neither direction
//! copies a transpose.

use burn::tensor::ops::FloatTensor;
use burn::tensor::TensorMetadata;

pub use crate::backend::gemm::{batched_dims, Transposes};
pub use crate::backend::ops::gemm::batched_matmul_reference;
use super::differentiable::DifferentiableOp;
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

/// `op(a) · op(b)` as a differentiable op (`LowpLinear::lowp_differentiable`): backward keeps A
/// when B's gradient is wanted and B when A's is.
#[derive(Debug)]
pub struct BatchedMatmulOp {
    pub transposes: Transposes,
}

impl<B: LowpBackend> DifferentiableOp<B, 2> for BatchedMatmulOp {
    /// A, B and the flags.
    type State = (Option<FloatTensor<B>>, Option<FloatTensor<B>>, Transposes);

    fn forward(
        self,
        [a, b]: [FloatTensor<B>; 2],
        [track_a, track_b]: [bool; 2],
    ) -> Result<(FloatTensor<B>, Self::State)> {
        let t = self.transposes;
        let c = batched_matmul::<B>(a.clone(), b.clone(), t)?;
        Ok((c, (track_b.then_some(a), track_a.then_some(b), t)))
    }

    fn backward(
        (a, b, t): Self::State,
        dc: FloatTensor<B>,
        [want_a, want_b]: [bool; 2],
    ) -> [Option<FloatTensor<B>>; 2] {
        let da = b.filter(|_| want_a).map(|b| grad_a::<B>(b, dc.clone(), t));
        let db = a.filter(|_| want_b).map(|a| grad_b::<B>(a, dc, t));
        [da, db]
    }
}
