//! Runs a `QuantizerSpec` on a grouped (MoE) matrix: each group as its slice alone would be
//! (`format::grouped`). Plain formats go through `GroupedOps::grouped_quantize`, a delayed
//! request with one scale per group, identity keeps the matrix (group views slice it), and hybrid
//! quantizes each direction with its side.

use burn::tensor::ops::FloatTensor;
use burn::tensor::{Tensor, TensorMetadata, TensorPrimitive};

use crate::backend::grouped::group_view;
use crate::backend::{matrix_dims, Groups, LowpBackend};
use crate::error::{LowpError, Result};
use crate::format::grouped::GroupScaling;
use crate::format::{Direction, Usage};
use crate::quant::quantizer::identity;
use crate::quant::DelayedCast;
use crate::quant::spec::{ColumnwiseSource, QuantizerSpec};
use crate::quant::QuantizedTensor;

/// Quantizes the grouped matrix `x` with `spec` (group g's stochastic rounding seeded
/// `seed + g`); `delayed` gives a delayed request's scale columns (one per group), format and
/// history columns;
/// `scaling` says whether FP8 per-tensor groups share one scale.
pub fn quantize_grouped<B: LowpBackend>(
    x: FloatTensor<B>,
    groups: &Groups<B>,
    spec: &QuantizerSpec,
    usage: Usage,
    seed: u64,
    delayed: Option<DelayedCast<B>>,
    scaling: GroupScaling,
) -> Result<QuantizedTensor<B>> {
    match spec {
        QuantizerSpec::Identity { dtype } => Ok(identity::<B>(x, *dtype, usage)),
        QuantizerSpec::Fp8Delayed(_) => {
            let delayed = delayed.ok_or_else(|| {
                LowpError::invalid(
                    "quantizer",
                    spec.name(),
                    "a delayed-scaling slot needs its module's scales",
                )
            })?;
            B::grouped_quantize_fp8_with_scale(
                x,
                delayed.fp8,
                delayed.scales,
                groups,
                usage,
                scaling,
                delayed.record,
            )
        }
        QuantizerSpec::Hybrid {
            rowwise,
            columnwise,
            columnwise_source,
        } => {
            let (rows, cols) = matrix_dims(x.shape().as_slice());
            let row = if usage.rowwise {
                Some(quantize_grouped(
                    x.clone(),
                    groups,
                    rowwise,
                    Usage::ROWWISE,
                    seed,
                    delayed.clone(),
                    scaling,
                )?)
            } else {
                None
            };
            let col = if usage.columnwise {
                let source = match columnwise_source {
                    ColumnwiseSource::Original => x,
                    ColumnwiseSource::RowwiseDequantized => {
                        let row = match &row {
                            Some(row) => row.clone(),
                            None => quantize_grouped(
                                x,
                                groups,
                                rowwise,
                                Usage::ROWWISE,
                                seed,
                                delayed.clone(),
                                scaling,
                            )?,
                        };
                        dequantize_grouped(&row, groups, Direction::Rowwise)?
                    }
                };
                Some(quantize_grouped(
                    source,
                    groups,
                    columnwise,
                    Usage::COLUMNWISE,
                    seed,
                    delayed,
                    scaling,
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
        plain => B::grouped_quantize(x, groups, &plain.format_config(Some(seed))?, usage, scaling),
    }
}

/// Dequantizes one representation of a grouped tensor group by group (f32 `[rows, cols]`, zero
/// tail). Reads the groups on the host.
pub fn dequantize_grouped<B: LowpBackend>(
    q: &QuantizedTensor<B>,
    groups: &Groups<B>,
    direction: Direction,
) -> Result<FloatTensor<B>> {
    let host = groups.host.get()?;
    let mut pieces: Vec<Tensor<B, 2>> = Vec::new();
    let mut covered = 0;
    for (g, group) in host.groups.iter().enumerate() {
        if group.len == 0 {
            continue;
        }
        pieces.push(Tensor::from_primitive(TensorPrimitive::Float(B::float_cast(
            B::quantize_dequantize(&group_view(q, g, *group), direction)?,
            burn::tensor::FloatDType::F32,
        ))));
        covered = group.start + group.len;
    }
    if covered < q.rows {
        let device = match pieces.first() {
            Some(p) => p.device(),
            None => {
                return Err(LowpError::invalid(
                    "grouped tensor",
                    "no group holds rows",
                    "dequantizing needs at least one non-empty group",
                ))
            }
        };
        pieces.push(Tensor::zeros(
            [q.rows - covered, q.cols],
            burn::tensor::TensorCreationOptions::new(device).with_dtype(burn::tensor::DType::F32),
        ));
    }
    Ok(Tensor::cat(pieces, 0).into_primitive().tensor())
}
