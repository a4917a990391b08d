//! Conversions between our quantized storages and Burn's native quantized tensors
//! (`TensorPrimitive::QFloat`, a `QuantScheme` with `QuantStore::Native`).
//!
//! Burn 0.21 dequantizes a native quantized tensor as `param * value`, one param per block of
//! `QuantLevel::Block(size)` (or one for `QuantLevel::Tensor`), params row-major in the shape
//! `params_shape` gives (`ceil(dim / block)` per dimension). Our stored `scale_inv` is that very
//! multiplier (TE's `scale` is the one applied *before* the cast; `scale_inv = 1 / scale` is what
//! dequantize multiplies by), so params are our scale bytes unchanged and the codes are our code
//! bytes unchanged:
//!
//! | ours | Burn `QuantScheme` |
//! |---|---|
//! | FP8 per-tensor E4M3/E5M2 | `value: E4M3/E5M2`, `level: Tensor`, `param: F32` |
//! | FP8 block 1x128 | `level: Block([1, 128])`, `param: F32` |
//! | FP8 block 128x128 | `level: Block([128, 128])`, `param: F32` |
//! | MXFP8 rowwise (1D or 2D) | `level: Block([1, 32])`, `param: UE8M0` |
//!
//! A storage converts as the matrix its codes hold: FP8 per-tensor and block columnwise codes are
//! the transpose `[K, M]`, so their Burn tensor is `[K, M]`. The `TensorData` bytes are the codes
//! followed directly by the params (what Burn's CubeCL `q_from_data` / `q_into_data` read and
//! write); reading takes the params from the end, so the f32-aligned padding `TensorData::quantized`
//! may insert is accepted too.
//!
//! What Burn 0.21 cannot express is an error (`LowpError::InvalidArgument` naming what is
//! missing), never an approximate tensor:
//! * NVFP4: no second-level (global f32) scale in `QuantScheme`; `QuantParam::UE4M3` scales are
//!   read as E8M0 by the CubeCL scale cast; E2M1 in `QuantStore::Native` panics, and
//!   `PackedNative` dequantize has no per-16 block layout we could check bit for bit;
//! * MXFP8 columnwise (32x1 blocks): Burn's native dequantize kernel takes one param per vector of
//!   up to 16 consecutive elements of the last dimension, so blocks one element wide would be
//!   dequantized with the wrong scales;
//! * swizzled MXFP8 scales: Burn reads row-major params (unswizzle them first).
//!
//! Lost on the way: the amax of FP8 per-tensor data (Burn has no field for it) and MXFP8's 2D flag
//! (its rowwise scales are per 1x32 block already, equal across each 32x32 tile); importing gives
//! `amax: None` and `block_2d: false`, which dequantize identically.

use burn::tensor::backend::DTypeUsage;
use burn::tensor::quantization::{
    BlockSize, QuantLevel, QuantMode, QuantParam, QuantScheme, QuantStore, QuantValue,
};
use burn::tensor::{DType, Tensor, TensorData};

use super::tensor::QuantizedTensor;
use crate::backend::LowpBackend;
use crate::error::{LowpError, Result};
use crate::format::fp8_block::FP8_BLOCK;
use crate::format::mxfp8::{round_up, MXFP8_BLOCK};
use crate::format::{
    BlockShape, Direction, Fp8Format, HostQuantized, QuantFormat, QuantizedData, ScaleLayout,
    Scales,
};

/// The error for a format or layout Burn 0.21 has no native quantized form of.
fn unsupported(format: &QuantFormat, direction: Direction, why: &str) -> LowpError {
    LowpError::invalid(
        "conversion to Burn's native quantized tensor",
        format!("{} {}", format.name(), direction.name()),
        format!("Burn 0.21 cannot hold it exactly: {why}"),
    )
}

fn quant_value(fp8: Fp8Format) -> QuantValue {
    match fp8 {
        Fp8Format::E4M3 => QuantValue::E4M3,
        Fp8Format::E5M2 => QuantValue::E5M2,
    }
}

fn native_scheme(value: QuantValue, level: QuantLevel, param: QuantParam) -> QuantScheme {
    QuantScheme {
        value,
        param,
        store: QuantStore::Native,
        level,
        mode: QuantMode::Symmetric,
    }
}

/// The Burn scheme of one storage of `format`, or the error saying what Burn lacks.
pub fn burn_scheme(format: QuantFormat, direction: Direction) -> Result<QuantScheme> {
    match format {
        QuantFormat::Fp8Tensor { fp8 } => Ok(native_scheme(
            quant_value(fp8),
            QuantLevel::Tensor,
            QuantParam::F32,
        )),
        QuantFormat::Fp8Block { fp8, block } => {
            let rows = match block {
                BlockShape::OneByOneTwentyEight => 1,
                BlockShape::OneTwentyEightSquare => FP8_BLOCK as u8,
            };
            Ok(native_scheme(
                quant_value(fp8),
                QuantLevel::Block(BlockSize::new([rows, FP8_BLOCK as u8])),
                QuantParam::F32,
            ))
        }
        QuantFormat::Mxfp8 { fp8, .. } => match direction {
            Direction::Rowwise => Ok(native_scheme(
                quant_value(fp8),
                QuantLevel::Block(BlockSize::new([1, MXFP8_BLOCK as u8])),
                QuantParam::UE8M0,
            )),
            Direction::Columnwise => Err(unsupported(
                &format,
                direction,
                "its 32x1 blocks are one element wide, and Burn's native dequantize applies one \
                 scale to each vector of up to 16 elements along the last dimension",
            )),
        },
        QuantFormat::Nvfp4 { .. } => Err(unsupported(
            &format,
            direction,
            "QuantScheme has no global (second-level) f32 scale, its UE4M3 block params are cast \
             as E8M0, and native E2M1 storage panics in q_from_data",
        )),
    }
}

fn f32_bytes(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

/// One storage's codes and scales as Burn `TensorData` of dtype `QFloat` (shape: the codes').
pub fn to_burn_data(
    format: QuantFormat,
    direction: Direction,
    data: &QuantizedData,
) -> Result<TensorData> {
    let scheme = burn_scheme(format, direction)?;
    let [rows, cols] = data.codes_shape;
    if data.codes.len() != rows * cols {
        return Err(LowpError::shape(
            "codes",
            format!("{} bytes", data.codes.len()),
            format!("codes of shape [{rows}, {cols}] need {} bytes", rows * cols),
        ));
    }
    let params = match (&data.scales, scheme.level) {
        (Scales::TensorScaleInv(s), QuantLevel::Tensor) => f32_bytes(&[*s]),
        (Scales::BlockF32 { shape, values }, QuantLevel::Block(block)) => {
            let expected = [rows / block[0] as usize, cols / block[1] as usize];
            if *shape != expected
                || values.len() != expected[0] * expected[1]
                || rows % block[0] as usize != 0
                || cols % block[1] as usize != 0
            {
                return Err(LowpError::shape(
                    "FP8 block scales",
                    format!("{shape:?}"),
                    format!("codes [{rows}, {cols}] need block scales {expected:?}"),
                ));
            }
            f32_bytes(values)
        }
        (
            Scales::BlockBytes {
                shape,
                bytes,
                layout,
            },
            QuantLevel::Block(_),
        ) => {
            if *layout != ScaleLayout::Compact {
                return Err(unsupported(
                    &format,
                    direction,
                    "Burn reads row-major params: unswizzle the scales first",
                ));
            }
            let blocks = cols / MXFP8_BLOCK;
            let padded = [round_up(rows, 128), round_up(blocks, 4)];
            if cols % MXFP8_BLOCK != 0 || *shape != padded || bytes.len() != padded[0] * padded[1] {
                return Err(LowpError::shape(
                    "MXFP8 scales",
                    format!("{shape:?}"),
                    format!("codes [{rows}, {cols}] need compact scales {padded:?}"),
                ));
            }
            // Burn's params are exactly [rows, cols / 32]: drop the GEMM padding.
            (0..rows)
                .flat_map(|r| &bytes[r * padded[1]..r * padded[1] + blocks])
                .copied()
                .collect()
        }
        _ => {
            return Err(LowpError::invalid(
                "scales",
                format.name(),
                "do not match the format's scale kind",
            ))
        }
    };
    let mut bytes = data.codes.clone();
    bytes.extend_from_slice(&params);
    Ok(TensorData::from_bytes_vec(
        bytes,
        [rows, cols],
        DType::QFloat(scheme),
    ))
}

/// Our format and (rowwise-layout) storage data of a Burn native quantized `TensorData` of rank 2,
/// for the schemes [`burn_scheme`] produces; anything else is an error.
pub fn from_burn_data(data: &TensorData) -> Result<(QuantFormat, QuantizedData)> {
    let not_ours = |rule: &str| {
        LowpError::invalid(
            "Burn quantized tensor",
            format!("{:?} of shape {:?}", data.dtype, data.shape.as_slice()),
            rule.to_string(),
        )
    };
    let DType::QFloat(scheme) = data.dtype else {
        return Err(not_ours("is not a quantized (QFloat) tensor"));
    };
    let &[rows, cols] = data.shape.as_slice() else {
        return Err(not_ours("burn-lowp storages are matrices: rank 2 only"));
    };
    if scheme.store != QuantStore::Native || scheme.mode != QuantMode::Symmetric {
        return Err(not_ours("needs QuantStore::Native, symmetric"));
    }
    let fp8 = match scheme.value {
        QuantValue::E4M3 => Fp8Format::E4M3,
        QuantValue::E5M2 => Fp8Format::E5M2,
        _ => return Err(not_ours("only E4M3 and E5M2 values convert")),
    };
    let block = match scheme.level {
        QuantLevel::Tensor => None,
        QuantLevel::Block(b) => Some(b.to_dim_vec(2)),
    };
    let (format, num_params, param_size) = match (block.as_deref(), scheme.param) {
        (None, QuantParam::F32) => (QuantFormat::Fp8Tensor { fp8 }, 1, 4),
        (Some([1, 128]), QuantParam::F32) => (
            QuantFormat::Fp8Block {
                fp8,
                block: BlockShape::OneByOneTwentyEight,
            },
            rows * (cols / FP8_BLOCK),
            4,
        ),
        (Some([128, 128]), QuantParam::F32) => (
            QuantFormat::Fp8Block {
                fp8,
                block: BlockShape::OneTwentyEightSquare,
            },
            (rows / FP8_BLOCK) * (cols / FP8_BLOCK),
            4,
        ),
        (Some([1, 32]), QuantParam::UE8M0) => (
            QuantFormat::Mxfp8 {
                fp8,
                block_2d: false,
            },
            rows * (cols / MXFP8_BLOCK),
            1,
        ),
        _ => {
            return Err(not_ours(
                "only per-tensor F32, 1x128 / 128x128 F32 and 1x32 UE8M0 schemes convert",
            ))
        }
    };
    if let Some(b) = &block {
        if rows % b[0] as usize != 0 || cols % b[1] as usize != 0 {
            return Err(not_ours("blocks must tile the matrix exactly"));
        }
    }
    let bytes: &[u8] = &data.bytes;
    let numel = rows * cols;
    let params_len = num_params * param_size;
    if bytes.len() < numel + params_len {
        return Err(not_ours("holds fewer bytes than its codes and params need"));
    }
    let codes = bytes[..numel].to_vec();
    let params = &bytes[bytes.len() - params_len..];
    let f32s = || -> Vec<f32> {
        params
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect()
    };
    let (scales, amax) = match format {
        QuantFormat::Fp8Tensor { .. } => (Scales::TensorScaleInv(f32s()[0]), None),
        QuantFormat::Fp8Block { block, .. } => {
            let block_rows = match block {
                BlockShape::OneByOneTwentyEight => 1,
                BlockShape::OneTwentyEightSquare => FP8_BLOCK,
            };
            (
                Scales::BlockF32 {
                    shape: [rows / block_rows, cols / FP8_BLOCK],
                    values: f32s(),
                },
                None,
            )
        }
        _ => {
            // MXFP8: back into the zero-padded compact layout the GEMMs read.
            let blocks = cols / MXFP8_BLOCK;
            let shape = [round_up(rows, 128), round_up(blocks, 4)];
            let mut padded = vec![0u8; shape[0] * shape[1]];
            for r in 0..rows {
                padded[r * shape[1]..r * shape[1] + blocks]
                    .copy_from_slice(&params[r * blocks..(r + 1) * blocks]);
            }
            (
                Scales::BlockBytes {
                    shape,
                    bytes: padded,
                    layout: ScaleLayout::Compact,
                },
                None,
            )
        }
    };
    Ok((
        format,
        QuantizedData {
            codes,
            codes_shape: [rows, cols],
            scales,
            amax,
        },
    ))
}

impl<B: LowpBackend> QuantizedTensor<B> {
    /// The storage of `direction` as a Burn native quantized tensor (of its codes' shape: `[K, M]`
    /// for FP8 columnwise storages), on the device its codes live on. Reads the storage to the
    /// host and uploads Burn's tensor (a synchronizing copy).
    pub fn to_burn(&self, direction: Direction) -> Result<Tensor<B, 2>> {
        let storage = self.quantized(direction)?;
        // Fail before the device read where the scheme has no Burn form.
        let scheme = burn_scheme(storage.format, direction)?;
        let device = B::bytes_device(&storage.codes);
        // NdArray's `q_from_data` panics on FP8 values and wgpu has no FP8 storage: say so
        // instead of handing Burn a tensor it cannot hold.
        if !B::dtype_usage(&device, DType::QFloat(scheme)).contains(DTypeUsage::Storage) {
            return Err(LowpError::invalid(
                "conversion to Burn's native quantized tensor",
                format!("{} on {}", storage.format.name(), B::name(&device)),
                "this backend cannot store FP8 quantized tensors (Burn 0.21: CUDA can)",
            ));
        }
        let data = to_burn_data(storage.format, direction, &storage.to_host())?;
        Ok(Tensor::from_data(data, &device))
    }

    /// A rowwise quantized tensor holding a Burn native quantized matrix (a schema
    /// [`burn_scheme`] produces), on the tensor's device. Reads Burn's tensor to the host.
    pub fn from_burn(tensor: Tensor<B, 2>) -> Result<Self> {
        let device = tensor.device();
        let data = tensor.into_data();
        let (format, data) = from_burn_data(&data)?;
        let host = HostQuantized {
            format,
            rows: data.codes_shape[0],
            cols: data.codes_shape[1],
            rowwise: Some(data),
            columnwise: None,
        };
        Ok(Self::from_host(&host, |bytes| {
            B::bytes_from_host(bytes, &device)
        }))
    }
}
