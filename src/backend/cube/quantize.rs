//! `QuantizeOps` on `CubeBackend`: the FP8 (per-tensor, block), MXFP8 and NVFP4 quantize and
//! dequantize kernels of `burn_lowp_kernels`, the scales' swizzle, and FP8 delayed scaling's
//! cast and state update, each one launch (or two: an amax pass, then the cast).

use burn::tensor::ops::{FloatTensor, FloatTensorOps};
use burn::tensor::{DType, Shape, TensorMetadata};
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::{BoolElement, CubeBackend, CubeRuntime, FloatElement, IntElement};
use burn_lowp_kernels as kernels;
use kernels::{Directions, InputMatrix};

use super::CubeBytes;
use super::buffers::{elem_kind, float_tensor, kernel_error, prepare};
use super::cast::{
    fp8_kind, fp8_scaled, history_row, quantize_plain, relayout, wrap, StateTarget,
};
use crate::backend::{
    matrix_dims, AmaxHistoryColumns, QuantizeOps, QuantizedTensor, ScaleColumns, Storage,
    StorageScales,
};
use crate::error::{LowpError, Result};
use crate::format::{check_shape, Direction, FormatConfig, Fp8Format, QuantFormat, ScaleLayout, Usage};

impl<R: CubeRuntime, F: FloatElement, I: IntElement, BT: BoolElement> QuantizeOps<Self>
    for CubeBackend<R, F, I, BT>
{
    fn quantize_delayed_amax_in_place() -> bool {
        true
    }

    fn quantize_delayed_update(
        history: FloatTensor<Self>,
        scale: FloatTensor<Self>,
        numerator: f32,
        most_recent: bool,
    ) -> Result<(FloatTensor<Self>, FloatTensor<Self>)> {
        let dims = history.shape().as_slice().to_vec();
        let [len, width] = dims[..] else {
            return Err(LowpError::shape("amax history", format!("{dims:?}"), "[history_len, slots]"));
        };
        if history.dtype != DType::F32 || scale.dtype != DType::F32 || scale.shape().num_elements() != width {
            return Err(LowpError::shape(
                "delayed-scaling state",
                format!("history {:?} {dims:?}, scale {:?} {:?}", history.dtype, scale.dtype, scale.shape().as_slice()),
                "an f32 history [len, slots] and f32 scales [slots]",
            ));
        }
        let (history, scale) = (into_contiguous(history), into_contiguous(scale));
        let (client, device) = (history.client.clone(), history.device.clone());
        let (new_history, new_scale) = kernels::delayed_scaling::delayed_scaling_update(
            &client,
            &history.handle,
            &scale.handle,
            len,
            width,
            numerator,
            most_recent,
        );
        let f32_tensor = |handle, shape: Vec<usize>| {
            CubeTensor::new_contiguous(client.clone(), device.clone(), Shape::from(shape), handle, DType::F32)
        };
        Ok((f32_tensor(new_history, vec![len, width]), f32_tensor(new_scale, vec![width])))
    }

    fn quantize_tensor(
        x: FloatTensor<Self>,
        config: &FormatConfig,
        usage: Usage,
        optimize_for_gemm: bool,
    ) -> Result<QuantizedTensor<Self>> {
        quantize_plain::<R, Self>(x, config, usage, optimize_for_gemm, None)
    }

    fn quantize_fp8_with_scale(
        x: FloatTensor<Self>,
        fp8: Fp8Format,
        scale: ScaleColumns<Self>,
        usage: Usage,
        record: Option<AmaxHistoryColumns<Self>>,
    ) -> Result<QuantizedTensor<Self>> {
        let (rows, cols) = matrix_dims(&x.shape().as_slice());
        let format = QuantFormat::Fp8Tensor { fp8 };
        let history = history_row(record, 1)?;
        check_shape("input", rows, cols, &format)?;
        let scale = StateTarget::scales(scale, 1)?;
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
        let out = kernels::quantize_fp8_tensor(
            &client,
            input,
            fp8_kind(fp8),
            kernels::TensorScaling::Delayed {
                scale: scale.kernel_arg(),
                history: history.as_ref().map(|h| h.kernel_arg()),
            },
            directions,
            None,
            false,
        )
        .map_err(kernel_error("input"))?;
        Ok(wrap(&client, &device, out, format, (rows, cols), false, 1))
    }

    fn quantize_dequantize(
        q: &QuantizedTensor<Self>,
        direction: Direction,
    ) -> Result<FloatTensor<Self>> {
        let storage = match q.require(direction)? {
            Storage::Quantized(storage) => storage,
            Storage::HighPrecision(t) => {
                return Ok(Self::float_cast(t.clone(), burn::tensor::FloatDType::F32))
            }
        };
        let client = storage.codes.client.clone();
        let rowwise = direction == Direction::Rowwise;
        let (rows, cols) = (q.rows, q.cols);
        let handle = if let Some((fp8, kind, scales)) = fp8_scaled::<Self>(storage) {
            kernels::dequantize_fp8(
                &client,
                &storage.codes.handle,
                &scales.handle,
                rows,
                cols,
                fp8_kind(fp8),
                kind,
                !rowwise,
            )
        } else {
            match (&storage.format, &storage.scales) {
                (
                    QuantFormat::Mxfp8 { fp8, .. },
                    StorageScales::BlockBytes {
                        bytes,
                        layout: ScaleLayout::Compact,
                        ..
                    },
                ) => kernels::dequantize_mxfp8(
                    &client,
                    &storage.codes.handle,
                    &bytes.handle,
                    rows,
                    cols,
                    fp8_kind(*fp8),
                    rowwise,
                ),
                (
                    QuantFormat::Nvfp4 { rht, .. },
                    StorageScales::BlockBytes {
                        bytes,
                        layout: ScaleLayout::Compact,
                        ..
                    },
                ) => {
                    let amax = storage.amax.as_ref().ok_or_else(|| {
                        LowpError::invalid("NVFP4 amax", "none", "NVFP4 data carries its global amax")
                    })?;
                    kernels::dequantize_nvfp4(
                        &client,
                        &storage.codes.handle,
                        &bytes.handle,
                        &amax.handle,
                        rows,
                        cols,
                        rowwise,
                        *rht,
                    )
                }
                (
                    _,
                    StorageScales::BlockBytes {
                        layout: ScaleLayout::Swizzled,
                        ..
                    },
                ) => {
                    return Err(LowpError::invalid(
                        "scale layout",
                        "swizzled",
                        "dequantize reads compact scales: unswizzle them first",
                    ))
                }
                (format, _) => {
                    return Err(LowpError::invalid(
                        "scales",
                        format.name(),
                        "do not match the format",
                    ))
                }
            }
        };
        Ok(float_tensor(
            &client,
            &storage.codes.device,
            handle,
            rows,
            cols,
        ))
    }

    fn quantize_swizzle_scales(q: QuantizedTensor<Self>) -> Result<QuantizedTensor<Self>> {
        relayout(q, ScaleLayout::Swizzled, kernels::swizzle::<R>)
    }

    fn quantize_unswizzle_scales(q: QuantizedTensor<Self>) -> Result<QuantizedTensor<Self>> {
        relayout(q, ScaleLayout::Compact, kernels::unswizzle::<R>)
    }

    fn quantize_fp8_current_with_amax(
        x: FloatTensor<Self>,
        config: &FormatConfig,
        amax: &CubeBytes<R>,
        usage: Usage,
    ) -> Result<QuantizedTensor<Self>> {
        quantize_plain::<R, Self>(x, config, usage, false, Some(amax))
    }
}
