//! The signature types of the GEMM ops (`GemmOps`): which GEMM of a linear layer runs
//! (`GemmKind`), its options, a group of GEMMs that run together, the path a GEMM took, how FP8
//! per-tensor GEMMs accumulate (`SplitAccumulator`), and a batched product's transposes.

use burn::tensor::ops::FloatTensor;
use burn::tensor::{FloatDType, Shape};

use super::LowpBackend;
use crate::error::{LowpError, Result};
use crate::format::Direction;
use crate::backend::quantized::QuantizedTensor;

/// Which GEMM of a linear layer (TE `general_gemm` layouts):
/// * `Fprop`: `Y[M,N] = X[M,K] · W[N,K]ᵀ` with X rowwise and W rowwise;
/// * `Dgrad`: `dX[M,K] = dY[M,N] · W[N,K]` with dY rowwise and W columnwise;
/// * `Wgrad`: `dW[N,K] = dY[M,N]ᵀ · X[M,K]` with dY columnwise and X columnwise.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GemmKind {
    Fprop,
    Dgrad,
    Wgrad,
}

impl GemmKind {
    /// The representation each operand `(a, b)` contributes.
    pub fn directions(self) -> (Direction, Direction) {
        match self {
            GemmKind::Fprop => (Direction::Rowwise, Direction::Rowwise),
            GemmKind::Dgrad => (Direction::Rowwise, Direction::Columnwise),
            GemmKind::Wgrad => (Direction::Columnwise, Direction::Columnwise),
        }
    }

    /// Whether an FP8 per-tensor GEMM of this kind uses the split accumulator: `asked`
    /// (`GemmOptions::split_accumulator`), else TE's default (fprop fast, dgrad and wgrad split).
    pub fn split_accumulator(self, asked: Option<bool>) -> bool {
        asked.unwrap_or_else(|| SplitAccumulator::default().of(self))
    }

    /// Output shape for operands of logical shapes `a` and `b`, or an error if they do not fit.
    pub fn output_shape(self, a: [usize; 2], b: [usize; 2]) -> Result<[usize; 2]> {
        let (out, ok) = match self {
            GemmKind::Fprop => ([a[0], b[0]], a[1] == b[1]),
            GemmKind::Dgrad => ([a[0], b[1]], a[1] == b[0]),
            GemmKind::Wgrad => ([a[1], b[1]], a[0] == b[0]),
        };
        if !ok {
            return Err(LowpError::shape(
                format!("{self:?} GEMM operands"),
                format!("{a:?} and {b:?}"),
                "the contraction dimensions differ",
            ));
        }
        Ok(out)
    }
}

/// Options of a GEMM call.
#[derive(Debug, Clone)]
pub struct GemmOptions<B: LowpBackend> {
    /// Output dtype (F32 or BF16).
    pub out_dtype: FloatDType,
    /// Added to the product (`D = A·B + C`), e.g. gradient accumulation; same shape as the output.
    pub accumulate: Option<FloatTensor<B>>,
    /// FP8 per-tensor GEMMs on CUDA: whether cuBLASLt accumulates with the split accumulator
    /// (`recipe::SplitAccumulator`); `None` is TE's default for the GEMM's kind (fprop fast,
    /// dgrad and wgrad split). Block-scaled GEMMs always split; other paths accumulate in f32.
    pub split_accumulator: Option<bool>,
    /// Added to every row of the output (`D = A·B [+ C] + bias`), `[cols]` of the output; a
    /// linear layer's bias. On CUDA with a BF16 output it is cuBLASLt's bias epilogue (added in
    /// f32 before the one rounding to BF16, so the output is not written and read again);
    /// elsewhere, and for F32 outputs, an add after the GEMM.
    pub bias: Option<FloatTensor<B>>,
}

impl<B: LowpBackend> Default for GemmOptions<B> {
    fn default() -> Self {
        GemmOptions {
            out_dtype: FloatDType::F32,
            accumulate: None,
            split_accumulator: None,
            bias: None,
        }
    }
}

/// Checks a GEMM bias's shape against the output's columns.
pub(crate) fn check_bias<B: LowpBackend>(bias: &FloatTensor<B>, cols: usize) -> Result<()> {
    let shape = burn::tensor::TensorMetadata::shape(bias);
    if shape.as_slice() != [cols] {
        return Err(LowpError::shape(
            "GEMM bias",
            format!("{:?}", shape.as_slice()),
            format!("the GEMM output has {cols} columns"),
        ));
    }
    Ok(())
}

/// One GEMM of a group that runs together (`GemmOps::gemm_group`).
pub struct GemmCall<'a, B: LowpBackend> {
    pub kind: GemmKind,
    pub a: &'a QuantizedTensor<B>,
    pub b: &'a QuantizedTensor<B>,
    pub options: GemmOptions<B>,
}

/// Which path ran a GEMM (reported by `gemm_path` and in debug logs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GemmPath {
    /// Dequantize both operands to f32, then the backend's matmul.
    DequantizeMatmul,
    /// cuBLASLt in BF16/FP16/FP32.
    CublasLtHighPrecision,
    /// cuBLASLt FP8 with per-tensor scales.
    CublasLtFp8Tensor,
    /// cuBLASLt FP8 with 1x128 / 128x128 block scales (Hopper).
    CublasLtFp8Block,
    /// MXFP8 / NVFP4 on a GPU without block-scaled FP4/FP8 GEMMs: dequantize to BF16, BF16 GEMM.
    EmulatedBf16,
}

/// Which operands enter the product transposed: `a` stored `[batch, k, m]` for `Aᵀ`, `b` stored
/// `[batch, n, k]` for `Bᵀ`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Transposes {
    pub a: bool,
    pub b: bool,
}

/// `(batch, m, k, n)` of `op(a) · op(b)` for `a`, `b` of rank 3, or an error naming both shapes.
pub fn batched_dims(a: &Shape, b: &Shape, t: Transposes) -> Result<(usize, usize, usize, usize)> {
    let (da, db) = (a.as_slice(), b.as_slice());
    let bad = |rule: &str| {
        Err(LowpError::shape(
            "batched matmul operands",
            format!("a {da:?}, b {db:?} (transposed: a {}, b {})", t.a, t.b),
            rule.to_string(),
        ))
    };
    let (&[ba, a0, a1], &[bb, b0, b1]) = (da, db) else {
        return bad("both operands are [batch, rows, cols]");
    };
    if ba != bb {
        return bad("both operands have the same batch");
    }
    let (m, ka) = if t.a { (a1, a0) } else { (a0, a1) };
    let (kb, n) = if t.b { (b1, b0) } else { (b0, b1) };
    if ka != kb {
        return bad("op(a)'s columns equal op(b)'s rows");
    }
    Ok((ba, m, ka, n))
}

/// Whether each GEMM of a module accumulates FP8 per-tensor products with the split
/// accumulator (what a recipe's `fp8_gemm_*` fields resolve to; other formats ignore it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SplitAccumulator {
    pub fprop: bool,
    pub dgrad: bool,
    pub wgrad: bool,
}

impl Default for SplitAccumulator {
    /// TE's module defaults (`_2X_ACC_FPROP = False`, `_2X_ACC_DGRAD = _2X_ACC_WGRAD = True`).
    fn default() -> Self {
        SplitAccumulator {
            fprop: false,
            dgrad: true,
            wgrad: true,
        }
    }
}

impl SplitAccumulator {
    /// The setting of GEMM `kind`.
    pub fn of(&self, kind: GemmKind) -> bool {
        match kind {
            GemmKind::Fprop => self.fprop,
            GemmKind::Dgrad => self.dgrad,
            GemmKind::Wgrad => self.wgrad,
        }
    }
}
