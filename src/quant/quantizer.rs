//! Runs a `QuantizerSpec` on a tensor: plain formats through `QuantizeOps::quantize_tensor`,
//! identity as the (cast) tensor itself, hybrid as one quantizer per direction, and a delayed
//! request with the scale its module's state supplies.

use burn::tensor::ops::FloatTensor;
use burn::tensor::{DType, FloatDType, Shape, TensorMetadata};

use crate::backend::{matrix_dims, LowpBackend};
use crate::error::{LowpError, Result};
use crate::format::{Direction, Usage};
use crate::quant::spec::{ColumnwiseSource, IdentityDtype, QuantizerSpec};
use crate::quant::{DelayedCast, QuantizedTensor, Storage};

/// What a single quantize call needs beyond the tensor and its spec.
pub struct QuantizeCall<B: LowpBackend> {
    /// Seed of this call's stochastic rounding (NVFP4 SR); vary it between calls.
    pub seed: u64,
    /// For a delayed-scaling slot: its scale column, element format and history column.
    pub delayed: Option<DelayedCast<B>>,
}

impl<B: LowpBackend> QuantizeCall<B> {
    pub fn new(seed: u64) -> Self {
        QuantizeCall {
            seed,
            delayed: None,
        }
    }
}

/// Quantizes `x` (viewed as 2D) with `spec`, producing the representations in `usage`.
pub fn quantize<B: LowpBackend>(
    x: FloatTensor<B>,
    spec: &QuantizerSpec,
    usage: Usage,
    optimize_for_gemm: bool,
    call: &QuantizeCall<B>,
) -> Result<QuantizedTensor<B>> {
    match spec {
        QuantizerSpec::Identity { dtype } => Ok(identity::<B>(x, *dtype, usage)),
        QuantizerSpec::Fp8Delayed(_) => {
            let delayed = call.delayed.clone().ok_or_else(|| {
                LowpError::invalid(
                    "quantizer",
                    spec.name(),
                    "a delayed-scaling slot needs its module's scale",
                )
            })?;
            B::quantize_fp8_with_scale(x, delayed.fp8, delayed.scales, usage, delayed.record)
        }
        QuantizerSpec::Hybrid {
            rowwise,
            columnwise,
            columnwise_source,
        } => {
            let (rows, cols) = matrix_dims(x.shape().as_slice());
            let row = if usage.rowwise {
                Some(quantize::<B>(
                    x.clone(),
                    rowwise,
                    Usage::ROWWISE,
                    optimize_for_gemm,
                    call,
                )?)
            } else {
                None
            };
            let col = if usage.columnwise {
                let source = match (columnwise_source, &row) {
                    (ColumnwiseSource::RowwiseDequantized, Some(row)) => {
                        B::quantize_dequantize(row, Direction::Rowwise)?
                    }
                    (ColumnwiseSource::RowwiseDequantized, None) => {
                        let row = quantize::<B>(x, rowwise, Usage::ROWWISE, false, call)?;
                        B::quantize_dequantize(&row, Direction::Rowwise)?
                    }
                    (ColumnwiseSource::Original, _) => x,
                };
                Some(quantize::<B>(
                    source,
                    columnwise,
                    Usage::COLUMNWISE,
                    optimize_for_gemm,
                    call,
                )?)
            } else {
                None
            };
            Ok(QuantizedTensor {
                rows,
                cols,
                rowwise: row.and_then(|q| q.rowwise),
                columnwise: col.and_then(|q| q.columnwise),
            })
        }
        plain => B::quantize_tensor(
            x,
            &plain.format_config(Some(call.seed))?,
            usage,
            optimize_for_gemm,
        ),
    }
}

/// Identity: the tensor itself as a `[rows, cols]` matrix in `dtype` (kept as is where the
/// backend cannot hold that dtype, e.g. NdArray and bf16), one buffer serving both directions.
pub(crate) fn identity<B: LowpBackend>(
    x: FloatTensor<B>,
    dtype: IdentityDtype,
    usage: Usage,
) -> QuantizedTensor<B> {
    let (rows, cols) = matrix_dims(x.shape().as_slice());
    let x = B::float_reshape(x, Shape::new([rows, cols]));
    let target = match dtype {
        IdentityDtype::Bf16 => FloatDType::BF16,
        IdentityDtype::F16 => FloatDType::F16,
        IdentityDtype::F32 => FloatDType::F32,
    };
    let device = B::float_device(&x);
    let x = if B::supports_dtype(&device, DType::from(target)) && x.dtype() != DType::from(target) {
        B::float_cast(x, target)
    } else {
        x
    };
    QuantizedTensor {
        rows,
        cols,
        rowwise: usage.rowwise.then(|| Storage::HighPrecision(x.clone())),
        columnwise: usage.columnwise.then(|| Storage::HighPrecision(x)),
    }
}
