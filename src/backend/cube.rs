//! `LowpBackend` for `CubeBackend<R, ..>`: the CubeCL kernels of `burn-lowp-kernels`, on CUDA or
//! wgpu. Inputs are read as raw words of their own dtype (f32, f16 or bf16).

use burn::tensor::ops::{FloatTensor, FloatTensorOps};
use burn::tensor::{DType, Shape, TensorMetadata};
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::{BoolElement, CubeBackend, CubeRuntime, FloatElement, IntElement};
use burn_lowp_kernels as kernels;
use burn_lowp_kernels::cubecl::prelude::*;
use burn_lowp_kernels::cubecl::server::Handle;
use kernels::scale::ScaleRule;
use kernels::{
    DirectionOutput, Directions, ElemKind, Fp8Kind, InputMatrix, KernelError, QuantizeOutput,
};

use super::{matrix_dims, LowpBackend};
use crate::error::{LowpError, Result};
use crate::format::fp8_block::BlockShape;
use crate::format::random::{stream_key, COLUMNWISE_STREAM, ROWWISE_STREAM};
use crate::format::{
    check_shape, codes_shape, scales_shape, Direction, FormatConfig, Fp8Format, HostMatrix,
    InputDtype, QuantFormat, ScaleLayout, Usage,
};
use crate::quant::{QuantizedStorage, QuantizedTensor, Storage, StorageScales};

/// A device byte buffer: a CubeCL handle and its length in bytes.
#[derive(Clone)]
pub struct CubeBytes<R: CubeRuntime> {
    pub client: ComputeClient<R>,
    pub device: R::Device,
    pub handle: Handle,
    pub len: usize,
}

impl<R: CubeRuntime> std::fmt::Debug for CubeBytes<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CubeBytes({} bytes)", self.len)
    }
}

fn fp8_kind(fp8: Fp8Format) -> Fp8Kind {
    match fp8 {
        Fp8Format::E4M3 => Fp8Kind::E4M3,
        Fp8Format::E5M2 => Fp8Kind::E5M2,
    }
}

fn elem_kind(dtype: DType, tensor: &str) -> Result<ElemKind> {
    match dtype {
        DType::F32 => Ok(ElemKind::F32),
        DType::F16 => Ok(ElemKind::F16),
        DType::BF16 => Ok(ElemKind::BF16),
        other => Err(LowpError::Dtype {
            tensor: tensor.to_string(),
            dtype: format!("{other:?}"),
            supported: "quantize kernels read F32, F16 and BF16".to_string(),
        }),
    }
}

fn kernel_error(tensor: &str) -> impl Fn(KernelError) -> LowpError + '_ {
    move |e| LowpError::shape(tensor, e.value, e.rule)
}

/// A contiguous tensor whose data starts 16-byte aligned (the kernels load 16-byte vectors).
fn prepare<R: CubeRuntime>(x: CubeTensor<R>) -> CubeTensor<R> {
    let x = into_contiguous(x);
    if x.handle.offset_start.unwrap_or(0) % 16 == 0 {
        x
    } else {
        // A view into a larger buffer at an unaligned offset: copy it (x * 1 is exact).
        let copy = CubeBackend::<R, f32, i32, u32>::float_mul_scalar(x, 1.0f32.into());
        into_contiguous(copy)
    }
}

fn bytes<R: CubeRuntime>(
    client: &ComputeClient<R>,
    device: &R::Device,
    handle: Handle,
    len: usize,
) -> CubeBytes<R> {
    CubeBytes {
        device: device.clone(),
        client: client.clone(),
        handle,
        len,
    }
}

/// Wraps kernel outputs in a `QuantizedTensor`, with shapes from the format's layout rules.
fn wrap<R: CubeRuntime, B: LowpBackend<Bytes = CubeBytes<R>>>(
    client: &ComputeClient<R>,
    device: &R::Device,
    out: QuantizeOutput,
    format: QuantFormat,
    rows: usize,
    cols: usize,
    swizzled: bool,
) -> QuantizedTensor<B> {
    let storage = |side: Option<DirectionOutput>, direction: Direction| {
        side.map(|d| {
            let cshape = codes_shape(&format, rows, cols, direction);
            let sshape = scales_shape(&format, rows, cols, direction);
            let scales = match format {
                QuantFormat::Fp8Tensor { .. } => {
                    StorageScales::TensorScaleInv(bytes(client, device, d.scales, 4))
                }
                QuantFormat::Fp8Block { .. } => StorageScales::BlockF32 {
                    shape: sshape,
                    bytes: bytes(client, device, d.scales, sshape[0] * sshape[1] * 4),
                },
                QuantFormat::Mxfp8 { .. } | QuantFormat::Nvfp4 { .. } => {
                    StorageScales::BlockBytes {
                        shape: sshape,
                        bytes: bytes(client, device, d.scales, sshape[0] * sshape[1]),
                        layout: if swizzled {
                            ScaleLayout::Swizzled
                        } else {
                            ScaleLayout::Compact
                        },
                    }
                }
            };
            Storage::Quantized(QuantizedStorage {
                format,
                codes: bytes(client, device, d.codes, cshape[0] * cshape[1]),
                codes_shape: cshape,
                scales,
                amax: d.amax.map(|a| bytes(client, device, a, 4)),
            })
        })
    };
    QuantizedTensor {
        rows,
        cols,
        rowwise: storage(out.rowwise, Direction::Rowwise),
        columnwise: storage(out.columnwise, Direction::Columnwise),
    }
}

fn float_tensor<R: CubeRuntime>(
    client: &ComputeClient<R>,
    device: &R::Device,
    handle: Handle,
    rows: usize,
    cols: usize,
) -> CubeTensor<R> {
    CubeTensor::new_contiguous(
        client.clone(),
        device.clone(),
        Shape::new([rows, cols]),
        handle,
        DType::F32,
    )
}

/// Applies `f` to the block-scale bytes of each storage, producing `target`.
fn relayout<R: CubeRuntime, B: LowpBackend<Bytes = CubeBytes<R>>>(
    mut q: QuantizedTensor<B>,
    target: ScaleLayout,
    f: impl Fn(
        &ComputeClient<R>,
        &Handle,
        usize,
        usize,
        bool,
    ) -> std::result::Result<Handle, KernelError>,
) -> Result<QuantizedTensor<B>> {
    for (storage, direction) in [
        (q.rowwise.as_mut(), Direction::Rowwise),
        (q.columnwise.as_mut(), Direction::Columnwise),
    ] {
        let Some(Storage::Quantized(storage)) = storage else {
            continue;
        };
        // The GEMM reads MXFP8 columnwise scales [M/32, K] as their transpose.
        let transposed = match storage.format {
            QuantFormat::Mxfp8 { .. } => direction == Direction::Columnwise,
            QuantFormat::Nvfp4 { .. } => false,
            other => {
                return Err(LowpError::invalid(
                    "scale layout",
                    format!("{target:?}"),
                    format!(
                        "only MXFP8 and NVFP4 have swizzled block scales, not {}",
                        other.name()
                    ),
                ))
            }
        };
        if let StorageScales::BlockBytes {
            shape,
            bytes,
            layout,
        } = &mut storage.scales
        {
            if *layout == target {
                continue;
            }
            let [r, c] = if transposed {
                [shape[1], shape[0]]
            } else {
                *shape
            };
            bytes.handle = f(&bytes.client, &bytes.handle, r, c, transposed)
                .map_err(kernel_error("scales"))?;
            *layout = target;
        }
    }
    Ok(q)
}

impl<R: CubeRuntime, F: FloatElement, I: IntElement, BT: BoolElement> LowpBackend
    for CubeBackend<R, F, I, BT>
{
    type Bytes = CubeBytes<R>;

    fn lowp_quantize(
        x: FloatTensor<Self>,
        config: &FormatConfig,
        usage: Usage,
        optimize_for_gemm: bool,
    ) -> Result<QuantizedTensor<Self>> {
        let (rows, cols) = matrix_dims(&x.shape().as_slice());
        let format = config.format();
        check_shape("input", rows, cols, &format)?;
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
        let swizzled =
            optimize_for_gemm && matches!(config, FormatConfig::Mxfp8(_) | FormatConfig::Nvfp4(_));
        let out = match config {
            FormatConfig::Fp8Current(c) => {
                let rule = ScaleRule {
                    fp8: fp8_kind(c.fp8),
                    pow2: c.pow2_scales,
                    epsilon_bits: c.amax_epsilon.to_bits(),
                    value_for_inf_bits: f32::MAX.to_bits(),
                };
                kernels::quantize_fp8_tensor(
                    &client,
                    input,
                    rule.fp8,
                    kernels::TensorScaling::Current { rule },
                    directions,
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
                )
            }
            FormatConfig::Mxfp8(c) => kernels::quantize_mxfp8(
                &client,
                input,
                fp8_kind(c.fp8),
                c.block_2d,
                directions,
                swizzled,
            ),
            FormatConfig::Nvfp4(c) => {
                let options = kernels::Nvfp4Options {
                    block_2d: c.block_2d,
                    rht: c.rht,
                    stochastic_keys: c.stochastic_seed.map(|s| {
                        (
                            stream_key(s, ROWWISE_STREAM),
                            stream_key(s, COLUMNWISE_STREAM),
                        )
                    }),
                };
                kernels::quantize_nvfp4(&client, input, options, directions, swizzled)
            }
        }
        .map_err(kernel_error("input"))?;
        Ok(wrap(&client, &device, out, format, rows, cols, swizzled))
    }

    fn quantize_fp8_with_scale(
        x: FloatTensor<Self>,
        fp8: Fp8Format,
        scale: FloatTensor<Self>,
        usage: Usage,
    ) -> Result<QuantizedTensor<Self>> {
        let (rows, cols) = matrix_dims(&x.shape().as_slice());
        let format = QuantFormat::Fp8Tensor { fp8 };
        check_shape("input", rows, cols, &format)?;
        if scale.dtype != DType::F32 || scale.shape().num_elements() != 1 {
            return Err(LowpError::shape(
                "scale",
                format!("{:?} {:?}", scale.dtype, scale.shape().as_slice()),
                "a delayed-scaling scale is one f32 value",
            ));
        }
        let kind = elem_kind(x.dtype, "input")?;
        let x = prepare(x);
        let scale = into_contiguous(scale);
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
                scale: &scale.handle,
            },
            directions,
        )
        .map_err(kernel_error("input"))?;
        Ok(wrap(&client, &device, out, format, rows, cols, false))
    }

    fn lowp_dequantize(
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
        let handle = match (&storage.format, &storage.scales) {
            (QuantFormat::Fp8Tensor { fp8 }, StorageScales::TensorScaleInv(s)) => {
                kernels::dequantize_fp8(
                    &client,
                    &storage.codes.handle,
                    &s.handle,
                    rows,
                    cols,
                    fp8_kind(*fp8),
                    kernels::Fp8Scales::Tensor,
                    !rowwise,
                )
            }
            (QuantFormat::Fp8Block { fp8, block }, StorageScales::BlockF32 { bytes, .. }) => {
                let kind = match block {
                    BlockShape::OneByOneTwentyEight => kernels::Fp8Scales::Block1x128,
                    BlockShape::OneTwentyEightSquare => kernels::Fp8Scales::Block128x128,
                };
                kernels::dequantize_fp8(
                    &client,
                    &storage.codes.handle,
                    &bytes.handle,
                    rows,
                    cols,
                    fp8_kind(*fp8),
                    kind,
                    !rowwise,
                )
            }
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
        };
        Ok(float_tensor(
            &client,
            &storage.codes.device,
            handle,
            rows,
            cols,
        ))
    }

    fn lowp_gemm(
        kind: super::GemmKind,
        a: &QuantizedTensor<Self>,
        b: &QuantizedTensor<Self>,
        options: super::GemmOptions<Self>,
    ) -> Result<FloatTensor<Self>> {
        #[cfg(feature = "cuda")]
        if super::cuda_gemm::is_cuda::<R>() {
            return super::cuda_gemm::gemm(kind, a, b, options);
        }
        super::gemm::dequantize_matmul(kind, a, b, burn::tensor::FloatDType::F32, options)
    }

    fn gemm_path(
        kind: super::GemmKind,
        a: &QuantizedTensor<Self>,
        b: &QuantizedTensor<Self>,
    ) -> super::GemmPath {
        #[cfg(feature = "cuda")]
        if super::cuda_gemm::is_cuda::<R>() {
            return super::cuda_gemm::gemm_path(kind, a, b);
        }
        let _ = (kind, a, b);
        super::GemmPath::DequantizeMatmul
    }

    fn swizzle_scales(q: QuantizedTensor<Self>) -> Result<QuantizedTensor<Self>> {
        relayout(q, ScaleLayout::Swizzled, kernels::swizzle::<R>)
    }

    fn unswizzle_scales(q: QuantizedTensor<Self>) -> Result<QuantizedTensor<Self>> {
        relayout(q, ScaleLayout::Compact, kernels::unswizzle::<R>)
    }

    fn bytes_to_host(bytes: &Self::Bytes) -> Vec<u8> {
        let data = bytes
            .client
            .read_one(bytes.handle.clone())
            .expect("device read failed");
        data[..bytes.len].to_vec()
    }

    fn float_from_bytes(bytes: &Self::Bytes, shape: [usize; 2]) -> FloatTensor<Self> {
        float_tensor(
            &bytes.client,
            &bytes.device,
            bytes.handle.clone(),
            shape[0],
            shape[1],
        )
    }

    fn float_from_host(m: &HostMatrix, device: &Self::Device) -> FloatTensor<Self> {
        let client = R::client(device);
        let (bytes, dtype): (Vec<u8>, DType) = match m.dtype {
            InputDtype::F32 => (
                m.values.iter().flat_map(|v| v.to_le_bytes()).collect(),
                DType::F32,
            ),
            InputDtype::F16 => (
                m.values
                    .iter()
                    .flat_map(|&v| half::f16::from_f32(v).to_le_bytes())
                    .collect(),
                DType::F16,
            ),
            InputDtype::BF16 => (
                m.values
                    .iter()
                    .flat_map(|&v| half::bf16::from_f32(v).to_le_bytes())
                    .collect(),
                DType::BF16,
            ),
        };
        let handle = client.create_from_slice(&bytes);
        CubeTensor::new_contiguous(
            client,
            device.clone(),
            Shape::new([m.rows, m.cols]),
            handle,
            dtype,
        )
    }
}
