//! `GroupedOps` on `CubeBackend`: grouped (MoE) matrices read on the device. The token batch's
//! aligned layout is made by one kernel from the device splits, whose host copy is requested at
//! once (`HostCopy`); the grouped quantize, dequantize, bias gradient, row gather and epilogue
//! kernels read the groups on the device; the grouped GEMM is CUDA's (`backend::cuda`) or one
//! GEMM per group elsewhere.

use burn::tensor::ops::{FloatTensor, IntTensor};
use burn::tensor::{DType, Shape, TensorMetadata};
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::{BoolElement, CubeBackend, CubeRuntime, FloatElement, IntElement};
use burn_lowp_kernels as kernels;
use kernels::scale::ScaleRule;
use kernels::{Directions, InputMatrix, RowGroups};

use super::CubeBytes;
use super::buffers::{bytes, elem_kind, i32_labels, index_kind, kernel_error, prepare};
use super::cast::{
    check_grouped_rows, current_scaling_rule, fp8_kind, fp8_scaled, history_row, nvfp4_options,
    wrap, StateTarget,
};
use super::group_layout::group_layout;
use crate::backend::grouped::{check_packed_rows, GROUP_ALIGN};
use crate::backend::ops::grouped::{
    dequantize_group_by_group, grouped_dbias_after_move, grouped_gemm_per_group,
    select_rows_or_zero,
};
use crate::backend::{
    matrix_dims, AmaxHistoryColumns, GemmKind, GemmOptions, GemmPath, GroupEpilogue, GroupLayout,
    GroupedFp8Scaling, GroupedGemmPath, GroupedOperand, GroupedOps, Groups, InputRows,
    QuantizedTensor, ScaleColumns, Storage,
};
use crate::error::{LowpError, Result};
use crate::format::fp8_block::BlockShape;
use crate::format::grouped::GroupScaling;
use crate::format::{check_shape, Direction, FormatConfig, Fp8Format, QuantFormat, Usage};

impl<R: CubeRuntime, F: FloatElement, I: IntElement, BT: BoolElement> GroupedOps<Self>
    for CubeBackend<R, F, I, BT>
{
    /// FP8 per-tensor and block formats: one kernel reading the groups on the device
    /// (`kernels::dequantize_fp8_grouped`); the other formats group by group.
    fn grouped_dequantize(
        q: &QuantizedTensor<Self>,
        direction: Direction,
        groups: &Groups<Self>,
        row_group: &IntTensor<Self>,
    ) -> Result<FloatTensor<Self>> {
        let Some(Storage::Quantized(storage)) = q.storage(direction) else {
            return dequantize_group_by_group::<Self>(q, direction, groups);
        };
        let Some((fp8, scale_kind, scales)) = fp8_scaled::<Self>(storage) else {
            return dequantize_group_by_group::<Self>(q, direction, groups);
        };
        let row_group = i32_labels::<R, F, I, BT>(row_group.clone());
        let client = storage.codes.client.clone();
        let handle = kernels::dequantize_fp8_grouped(
            &client,
            &storage.codes.handle,
            &scales.handle,
            &row_group.handle,
            RowGroups {
                start: &groups.start.handle,
                rows: &groups.len.handle,
                count: groups.count,
            },
            q.rows,
            q.cols,
            fp8_kind(fp8),
            scale_kind,
            direction == Direction::Columnwise,
        );
        Ok(CubeTensor::new_contiguous(
            client,
            storage.codes.device.clone(),
            Shape::new([q.rows, q.cols]),
            handle,
            DType::F32,
        ))
    }

    fn grouped_layout(m_splits: IntTensor<Self>, tokens: usize) -> Result<GroupLayout<Self>> {
        group_layout::<R, F, I, BT>(m_splits, tokens)
    }

    fn grouped_quantize(
        x: FloatTensor<Self>,
        groups: &Groups<Self>,
        config: &FormatConfig,
        usage: Usage,
        scaling: GroupScaling,
    ) -> Result<QuantizedTensor<Self>> {
        let (rows, cols) = matrix_dims(&x.shape().as_slice());
        let format = config.format();
        check_shape("input", rows, cols, &format)?;
        check_grouped_rows(rows, groups)?;
        let kind = elem_kind(x.dtype, "input")?;
        let x = prepare(x);
        let client = x.client.clone();
        let device = x.device.clone();
        let input = InputMatrix {
            handle: &x.handle,
            rows,
            cols,
            kind,
        };
        let directions = Directions {
            rowwise: usage.rowwise,
            columnwise: usage.columnwise,
        };
        let row_groups = Some(RowGroups {
            start: &groups.start.handle,
            rows: &groups.len.handle,
            count: groups.count,
        });
        let shared = scaling == GroupScaling::Shared && matches!(config, FormatConfig::Fp8Current(_));
        let out = match config {
            FormatConfig::Fp8Current(c) => {
                let rule = current_scaling_rule(c);
                kernels::quantize_fp8_tensor(
                    &client,
                    input,
                    rule.fp8,
                    kernels::TensorScaling::Current { rule },
                    directions,
                    row_groups,
                    shared,
                )
            }
            FormatConfig::Fp8Block(c) => {
                let rule = ScaleRule {
                    fp8: fp8_kind(c.fp8),
                    pow2: c.pow2_scales,
                    epsilon_bits: c.amax_epsilon.to_bits(),
                    value_for_inf_bits: kind.max_finite_bits(),
                };
                kernels::quantize_fp8_block(
                    &client,
                    input,
                    rule,
                    c.block == BlockShape::OneTwentyEightSquare,
                    directions,
                    row_groups,
                )
            }
            // MXFP8 keeps no per-tensor state and never transposes: on whole 128-row groups the
            // plain kernel already writes each group as its slice alone.
            FormatConfig::Mxfp8(c) => kernels::quantize_mxfp8(
                &client,
                input,
                fp8_kind(c.fp8),
                c.block_2d,
                directions,
                false,
            ),
            FormatConfig::Nvfp4(c) => kernels::quantize_nvfp4(
                &client,
                input,
                &nvfp4_options(c, groups.count),
                directions,
                false,
                row_groups,
            ),
        }
        .map_err(kernel_error("input"))?;
        let q = wrap(&client, &device, out, format, (rows, cols), false, groups.count);
        Ok(if shared { q.with_shared_scale() } else { q })
    }

    fn grouped_quantize_fp8_with_scale(
        x: FloatTensor<Self>,
        fp8: Fp8Format,
        scales: ScaleColumns<Self>,
        groups: &Groups<Self>,
        usage: Usage,
        scaling: GroupScaling,
        record: Option<AmaxHistoryColumns<Self>>,
    ) -> Result<QuantizedTensor<Self>> {
        let (rows, cols) = matrix_dims(&x.shape().as_slice());
        let format = QuantFormat::Fp8Tensor { fp8 };
        check_shape("input", rows, cols, &format)?;
        check_grouped_rows(rows, groups)?;
        let history = history_row(record, groups.count)?;
        let scales = StateTarget::scales(scales, groups.count)?;
        let kind = elem_kind(x.dtype, "input")?;
        let shared = scaling == GroupScaling::Shared;
        let x = prepare(x);
        let (client, device) = (x.client.clone(), x.device.clone());
        let input = InputMatrix {
            handle: &x.handle,
            rows,
            cols,
            kind,
        };
        let out = kernels::quantize_fp8_tensor(
            &client,
            input,
            fp8_kind(fp8),
            kernels::TensorScaling::Delayed {
                scale: scales.kernel_arg(),
                history: history.as_ref().map(|h| h.kernel_arg()),
            },
            Directions {
                rowwise: usage.rowwise,
                columnwise: usage.columnwise,
            },
            Some(RowGroups {
                start: &groups.start.handle,
                rows: &groups.len.handle,
                count: groups.count,
            }),
            shared,
        )
        .map_err(kernel_error("input"))?;
        let q = wrap(&client, &device, out, format, (rows, cols), false, groups.count);
        Ok(if shared { q.with_shared_scale() } else { q })
    }

    /// One amax pass and one cast that read the packed rows through `aligned_to_packed`
    /// (`kernels::RowGather`): the codes, scales and amaxes of padding, then quantizing.
    fn grouped_quantize_fp8_padded(
        x: FloatTensor<Self>,
        layout: &GroupLayout<Self>,
        scaling: GroupedFp8Scaling<Self>,
        usage: Usage,
        group_scaling: GroupScaling,
    ) -> Result<QuantizedTensor<Self>> {
        check_packed_rows(&x, layout)?;
        let (rows, cols) = (layout.rows(), x.shape()[1]);
        let fp8 = match &scaling {
            GroupedFp8Scaling::Current(c)
            | GroupedFp8Scaling::CurrentFromAmax { config: c, .. } => c.fp8,
            GroupedFp8Scaling::Delayed { fp8, .. } => *fp8,
        };
        let format = QuantFormat::Fp8Tensor { fp8 };
        check_shape("input", rows, cols, &format)?;
        check_grouped_rows(rows, &layout.groups)?;
        let kind = elem_kind(x.dtype, "input")?;
        let shared = group_scaling == GroupScaling::Shared;
        let x = prepare(x);
        let index = i32_labels::<R, F, I, BT>(layout.aligned_to_packed.clone());
        let (client, device) = (x.client.clone(), x.device.clone());
        let input = InputMatrix {
            handle: &x.handle,
            rows: layout.tokens,
            cols,
            kind,
        };
        let gather = Some(kernels::RowGather {
            index: &index.handle,
            rows,
        });
        let row_groups = Some(RowGroups {
            start: &layout.groups.start.handle,
            rows: &layout.groups.len.handle,
            count: layout.groups.count,
        });
        let directions = Directions {
            rowwise: usage.rowwise,
            columnwise: usage.columnwise,
        };
        let count = layout.groups.count;
        let history = match &scaling {
            GroupedFp8Scaling::Delayed { record, .. } => history_row(record.clone(), count)?,
            _ => None,
        };
        let delayed_scales = match &scaling {
            GroupedFp8Scaling::Delayed { scales, .. } => {
                Some(StateTarget::scales(scales.clone(), count)?)
            }
            _ => None,
        };
        let tensor_scaling = match (&scaling, &delayed_scales) {
            (GroupedFp8Scaling::Current(c), _) => kernels::TensorScaling::Current {
                rule: current_scaling_rule(c),
            },
            (GroupedFp8Scaling::CurrentFromAmax { config, amax }, _) => {
                if amax.len != 4 * count {
                    return Err(LowpError::shape(
                        "amax",
                        format!("{} bytes", amax.len),
                        format!("one f32 amax per group ({count})"),
                    ));
                }
                kernels::TensorScaling::CurrentFromAmax {
                    rule: current_scaling_rule(config),
                    amax: &amax.handle,
                }
            }
            (_, Some(scales)) => kernels::TensorScaling::Delayed {
                scale: scales.kernel_arg(),
                history: history.as_ref().map(|h| h.kernel_arg()),
            },
            (GroupedFp8Scaling::Delayed { .. }, None) => unreachable!("checked above"),
        };
        let out = kernels::quantize_fp8_tensor_gathered(
            &client,
            input,
            fp8_kind(fp8),
            tensor_scaling,
            directions,
            row_groups,
            shared,
            gather,
        )
        .map_err(kernel_error("input"))?;
        let q = wrap(&client, &device, out, format, (rows, cols), false, layout.groups.count);
        Ok(if shared { q.with_shared_scale() } else { q })
    }

    /// One read of `dy` (through the row map where packed) for the per-group column sums and,
    /// with `amax`, the per-group amaxes (`kernels::group_dbias_amax`).
    fn grouped_dbias_amax(
        dy: FloatTensor<Self>,
        rows: InputRows,
        layout: &GroupLayout<Self>,
        amax: bool,
    ) -> Result<(FloatTensor<Self>, Option<CubeBytes<R>>)> {
        let (dy_rows, cols) = matrix_dims(&dy.shape().as_slice());
        if dy_rows != rows.rows(layout) {
            return Err(LowpError::shape(
                "grouped dbias grad_output",
                format!("[{dy_rows}, {cols}]"),
                format!("the {} [{}, cols] rows of its layout", rows.name(), rows.rows(layout)),
            ));
        }
        let kind = match elem_kind(dy.dtype, "grouped dbias grad_output") {
            Ok(kind) if cols % 2 == 0 && layout.rows() * cols < u32::MAX as usize => kind,
            _ => return Ok((grouped_dbias_after_move(dy, rows, layout)?, None)),
        };
        check_grouped_rows(layout.rows(), &layout.groups)?;
        let dy = prepare(dy);
        let index = i32_labels::<R, F, I, BT>(layout.aligned_to_packed.clone());
        let client = dy.client.clone();
        let (sums, amaxes) = kernels::group_dbias_amax::group_dbias_amax(
            &client,
            InputMatrix {
                handle: &dy.handle,
                rows: dy_rows,
                cols,
                kind,
            },
            RowGroups {
                start: &layout.groups.start.handle,
                rows: &layout.groups.len.handle,
                count: layout.groups.count,
            },
            (rows == InputRows::Packed).then_some(kernels::RowGather {
                index: &index.handle,
                rows: layout.rows(),
            }),
            amax,
        )
        .map_err(kernel_error("grouped dbias grad_output"))?;
        let sums = CubeTensor::new_contiguous(
            client.clone(),
            dy.device.clone(),
            Shape::new([layout.groups.count, cols]),
            sums,
            DType::F32,
        );
        let amaxes = amaxes.map(|h| bytes(&client, &dy.device, h, 4 * layout.groups.count));
        Ok((sums, amaxes))
    }

    fn grouped_gemm_unscaled(
        kind: GemmKind,
        a: GroupedOperand<Self>,
        b: GroupedOperand<Self>,
        options: GemmOptions<Self>,
    ) -> Result<(FloatTensor<Self>, Option<(FloatTensor<Self>, FloatTensor<Self>)>)> {
        #[cfg(feature = "cuda")]
        if crate::backend::cuda::is_cuda::<R>() {
            return crate::backend::cuda::grouped::grouped_gemm_unscaled(kind, a, b, options, true);
        }
        Ok((grouped_gemm_per_group(kind, a, b, options)?, None))
    }

    fn grouped_gemm(
        kind: GemmKind,
        a: GroupedOperand<Self>,
        b: GroupedOperand<Self>,
        options: GemmOptions<Self>,
    ) -> Result<FloatTensor<Self>> {
        #[cfg(feature = "cuda")]
        if crate::backend::cuda::is_cuda::<R>() {
            return crate::backend::cuda::grouped::grouped_gemm(kind, a, b, options);
        }
        grouped_gemm_per_group(kind, a, b, options)
    }

    fn grouped_gemm_path(
        kind: GemmKind,
        a: GroupedOperand<Self>,
        b: GroupedOperand<Self>,
    ) -> GroupedGemmPath {
        #[cfg(feature = "cuda")]
        if crate::backend::cuda::is_cuda::<R>() {
            return crate::backend::cuda::grouped::grouped_gemm_path(kind, a, b);
        }
        let _ = (kind, a, b);
        GroupedGemmPath::PerGroup(GemmPath::DequantizeMatmul)
    }

    /// One kernel moving whole rows as 32-bit words (`kernels::row_gather`); Burn's `select`
    /// where a row is not a whole number of words or the index is not i32/i64.
    fn grouped_gather_rows(t: FloatTensor<Self>, index: IntTensor<Self>) -> FloatTensor<Self> {
        let shape = t.shape();
        let index_kind = index_kind(index.dtype);
        let row_bytes = shape.as_slice().get(1).map(|c| c * t.dtype.size());
        let (Some(index_kind), Some(row_bytes), 2) = (index_kind, row_bytes, shape.num_dims())
        else {
            return select_rows_or_zero::<Self>(t, index);
        };
        if row_bytes % 4 != 0 {
            return select_rows_or_zero::<Self>(t, index);
        }
        let t = into_contiguous(t);
        let index = into_contiguous(index);
        let (rows, cols, n) = (shape[0], shape[1], index.shape()[0]);
        let handle = kernels::row_gather::row_gather(
            &t.client,
            &t.handle,
            rows,
            &index.handle,
            index_kind,
            n,
            row_bytes / 4,
        );
        CubeTensor::new_contiguous(t.client.clone(), t.device.clone(), Shape::new([n, cols]), handle, t.dtype)
    }

    /// One kernel (`kernels::group_epilogue`; two for f32 with scales and biases) where y and the
    /// bias share a dtype and rows are whole words; Burn ops otherwise.
    fn grouped_epilogue(
        y: FloatTensor<Self>,
        row_group: IntTensor<Self>,
        epilogue: GroupEpilogue<Self>,
    ) -> FloatTensor<Self> {
        let shape = y.shape();
        let kind = elem_kind(y.dtype, "grouped GEMM output").ok();
        let groups = match (&epilogue.bias, &epilogue.scales) {
            (Some(b), _) => b.shape()[0],
            (None, Some((a, _))) => a.shape()[0],
            (None, None) => 0,
        };
        let fits = shape.num_dims() == 2
            && shape[1] % 2 == 0
            && epilogue.bias.as_ref().is_none_or(|b| {
                b.shape().num_dims() == 2 && b.shape()[1] == shape[1] && b.dtype == y.dtype
            })
            && epilogue.scales.as_ref().is_none_or(|(a, b)| {
                a.dtype == DType::F32
                    && b.dtype == DType::F32
                    && a.shape().num_elements() == groups
                    && b.shape().num_elements() == groups
            })
            && epilogue.gather.as_ref().is_none_or(|g| g.shape().num_dims() == 1);
        let (Some(kind), true) = (kind, fits) else {
            return crate::backend::grouped::group_epilogue_by_ops(y, row_group, epilogue);
        };
        // (Labels and the gather index in one integer type: i32, as the layout makes them.)
        let row_group = i32_labels::<R, F, I, BT>(row_group);
        let gather = epilogue.gather.map(i32_labels::<R, F, I, BT>);
        let bias = epilogue.bias.map(into_contiguous);
        let scales = epilogue.scales.map(|(a, b)| (into_contiguous(a), into_contiguous(b)));
        let y = into_contiguous(y);
        let (rows, cols) = (shape[0], shape[1]);
        let out_rows = gather.as_ref().map_or(rows, |g| g.shape()[0]);
        let handle = kernels::group_epilogue::group_epilogue(
            &y.client,
            &y.handle,
            &row_group.handle,
            kernels::row_gather::IndexKind::I32,
            rows,
            cols,
            groups,
            kind,
            kernels::group_epilogue::Epilogue {
                bias: bias.as_ref().map(|b| &b.handle),
                scales: scales.as_ref().map(|(a, b)| (&a.handle, &b.handle)),
                gather: gather.as_ref().map(|g| (&g.handle, out_rows)),
            },
        );
        CubeTensor::new_contiguous(y.client.clone(), y.device.clone(), Shape::new([out_rows, cols]), handle, y.dtype)
    }

    /// On the device: each 128-row chunk summed (`sum_dim`), then the chunks of each group added
    /// into its row (`select_assign`), without reading the groups on the host.
    fn grouped_column_sum(
        t: FloatTensor<Self>,
        layout: &GroupLayout<Self>,
    ) -> Result<FloatTensor<Self>> {
        use burn::tensor::{IndexingUpdateOp, Int, Tensor, TensorPrimitive};
        let t = Tensor::<Self, 2>::from_primitive(TensorPrimitive::Float(t));
        let [rows, cols] = t.dims();
        let chunks = rows / GROUP_ALIGN;
        let partial = t.reshape([chunks, GROUP_ALIGN, cols]).sum_dim(1).reshape([chunks, cols]);
        // A chunk's first row is a token of its group (or tail, group `count`).
        let chunk_group = Tensor::<Self, 1, Int>::from_primitive(layout.row_group.clone())
            .reshape([chunks, GROUP_ALIGN])
            .slice([0..chunks, 0..1])
            .reshape([chunks]);
        let count = layout.groups.count;
        let sums = Tensor::<Self, 2>::zeros(
            [count + 1, cols],
            burn::tensor::TensorCreationOptions::new(partial.device()).with_dtype(partial.dtype()),
        )
        .select_assign(0, chunk_group, partial, IndexingUpdateOp::Add);
        Ok(sums.slice([0..count, 0..cols]).into_primitive().tensor())
    }
}
