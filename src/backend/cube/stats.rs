//! `StatsOps` on `CubeBackend`: the debug tools' statistics of a tensor, and of what its
//! quantization loses, in one read (`kernels::stats`), the FP8 copies decoded in the same pass.
//! Odd widths take the host reference.

use burn::tensor::ops::{FloatTensor, FloatTensorOps, IntTensor};
use burn::tensor::TensorMetadata;
use burn_cubecl::{BoolElement, CubeBackend, CubeRuntime, FloatElement, IntElement};
use burn_lowp_kernels as kernels;
use kernels::{InputMatrix, RowGroups};

use super::CubeBytes;
use super::buffers::{bytes, elem_kind, i32_labels, prepare};
use super::cast::{fp8_kind, fp8_scaled};
use crate::backend::ops::stats::tensor_stats_on_host;
use crate::backend::{matrix_dims, BytesOps, Groups, QuantizedTensor, StatsOps, Storage};
use crate::error::{LowpError, Result};
use crate::format::Direction;

impl<R: CubeRuntime, F: FloatElement, I: IntElement, BT: BoolElement> StatsOps<Self>
    for CubeBackend<R, F, I, BT>
{
    fn stats_tensor(
        x: FloatTensor<Self>,
        error: Option<(FloatTensor<Self>, FloatTensor<Self>)>,
        labels: Option<(IntTensor<Self>, usize)>,
    ) -> Result<CubeBytes<R>> {
        let (rows, cols) = matrix_dims(&x.shape().as_slice());
        if rows == 0 || cols % 2 != 0 {
            return tensor_stats_on_host::<Self>(x, error, labels);
        }
        let labels = labels.map(|(row_group, count)| (i32_labels::<R, F, I, BT>(row_group), count));
        let kind = elem_kind(x.dtype, "debug statistics input")?;
        let x = prepare(x);
        let client = x.client.clone();
        let error = error.map(|(dq, limit)| {
            let dq = prepare(Self::float_cast(dq, burn::tensor::FloatDType::F32));
            let limit = prepare(Self::float_cast(limit, burn::tensor::FloatDType::F32));
            (dq, limit)
        });
        let input = InputMatrix {
            handle: &x.handle,
            rows,
            cols,
            kind,
        };
        let handle = kernels::stats::tensor_stats(
            &client,
            input,
            error.as_ref().map(|(dq, limit)| kernels::stats::StatsError::Dequantized {
                values: &dq.handle,
                limits: &limit.handle,
            }),
            labels.as_ref().map(|(row_group, count)| kernels::stats::RowLabels {
                row_group: &row_group.handle,
                count: *count,
            }),
        )
        .map_err(|e| LowpError::shape("debug statistics input", e.value, e.rule))?;
        let len = kernels::stats::stats_records(rows, cols) * kernels::stats::STAT_FIELDS * 4;
        Ok(bytes(&client, &x.device, handle, len))
    }

    fn stats_quantization(
        x: FloatTensor<Self>,
        q: &QuantizedTensor<Self>,
        directions: &[Direction],
        grouped: Option<(&Groups<Self>, IntTensor<Self>)>,
    ) -> Result<Option<Vec<CubeBytes<R>>>> {
        // Each direction's codes and scales, with the format they share.
        let mut copies = Vec::new();
        for &direction in directions {
            let Some(Storage::Quantized(storage)) = q.storage(direction) else {
                return Ok(None);
            };
            let Some((fp8, kind, scales)) = fp8_scaled::<Self>(storage) else {
                return Ok(None);
            };
            let codes = kernels::stats::Fp8Codes {
                codes: &storage.codes.handle,
                scales: &scales.handle,
            };
            copies.push((direction, fp8, kind, codes));
        }
        let copy = match copies.as_slice() {
            [(Direction::Rowwise, ..)] => kernels::stats::Fp8Copy::Rowwise(copies[0].3),
            [(Direction::Columnwise, ..)] => kernels::stats::Fp8Copy::Columnwise(copies[0].3),
            [(Direction::Rowwise, a, ka, r), (Direction::Columnwise, b, kb, c)]
            | [(Direction::Columnwise, b, kb, c), (Direction::Rowwise, a, ka, r)]
                if a == b && ka == kb =>
            {
                kernels::stats::Fp8Copy::Both {
                    rowwise: *r,
                    columnwise: *c,
                }
            }
            _ => return Ok(None),
        };
        let (_, fp8, scales_kind, _) = copies[0];
        let (rows, cols) = matrix_dims(&x.shape().as_slice());
        if rows == 0 || cols % 2 != 0 || cols != q.cols || rows > q.rows {
            return Ok(None);
        }
        let kind = elem_kind(x.dtype, "debug statistics input")?;
        let x = prepare(x);
        let client = x.client.clone();
        let labels = grouped
            .as_ref()
            .map(|(groups, row_group)| (i32_labels::<R, F, I, BT>(row_group.clone()), groups.count));
        let input = InputMatrix {
            handle: &x.handle,
            rows,
            cols,
            kind,
        };
        let error = kernels::stats::StatsError::Fp8Codes {
            copy,
            groups: grouped.as_ref().map(|(groups, _)| RowGroups {
                start: &groups.start.handle,
                rows: &groups.len.handle,
                count: groups.count,
            }),
            code_rows: q.rows,
            fp8: fp8_kind(fp8),
            fp8_max: fp8.max(),
            scales_kind,
        };
        let handle = kernels::stats::tensor_stats(
            &client,
            input,
            Some(error),
            labels.as_ref().map(|(row_group, count)| kernels::stats::RowLabels {
                row_group: &row_group.handle,
                count: *count,
            }),
        )
        .map_err(|e| LowpError::shape("debug statistics input", e.value, e.rule))?;
        // One set of records per direction, rowwise first: each direction's part (a view on CUDA).
        let len = kernels::stats::stats_records(rows, cols) * kernels::stats::STAT_FIELDS * 4;
        let all = bytes(&client, &x.device, handle, directions.len() * len);
        if directions.len() == 1 {
            return Ok(Some(vec![all]));
        }
        let set = |d: &Direction| {
            let s = if directions.len() == 2 && *d == Direction::Columnwise { 1 } else { 0 };
            Self::bytes_slice(&all, s * len..(s + 1) * len)
        };
        Ok(Some(directions.iter().map(set).collect()))
    }
}
