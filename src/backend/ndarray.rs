//! `LowpBackend` for `NdArray`: the reference quantizers on the host. NdArray tensors are f32, so
//! inputs are quantized as f32 (an RHT copy is therefore kept in f32, not rounded to bf16).

use std::sync::Arc;

use burn::backend::ndarray::{NdArray, NdArrayTensor};
use burn::tensor::ops::{FloatTensor, FloatTensorOps};
use burn::tensor::{read_sync, TensorData, TensorMetadata};

use super::{matrix_dims, LowpBackend};
use crate::error::{LowpError, Result};
use crate::format::{
    check_shape, quantize, quantize_fp8_with_scale, Direction, FormatConfig, Fp8Format, HostMatrix,
    InputDtype, Usage,
};
use crate::quant::{QuantizedStorage, QuantizedTensor, Storage};

/// Host bytes shared between clones.
pub type HostBytes = Arc<Vec<u8>>;

fn to_matrix(x: FloatTensor<NdArray>, name: &str) -> Result<HostMatrix> {
    let (rows, cols) = matrix_dims(&x.shape().as_slice());
    let data = read_sync(NdArray::<f32>::float_into_data(x))
        .map_err(|e| LowpError::invalid("tensor", name, format!("could not be read: {e:?}")))?;
    let values = data
        .convert::<f32>()
        .into_vec::<f32>()
        .map_err(|e| LowpError::invalid("tensor", name, format!("is not f32: {e:?}")))?;
    HostMatrix::new(name, rows, cols, InputDtype::F32, values)
}

fn upload(bytes: Vec<u8>) -> HostBytes {
    Arc::new(bytes)
}

/// Swizzles (or unswizzles) the scales of each quantized storage on its own, so that the two
/// directions of a hybrid tensor are handled each in its format.
fn relayout(
    mut q: QuantizedTensor<NdArray>,
    to_swizzled: bool,
) -> Result<QuantizedTensor<NdArray>> {
    for (storage, direction) in [
        (q.rowwise.as_mut(), Direction::Rowwise),
        (q.columnwise.as_mut(), Direction::Columnwise),
    ] {
        let Some(Storage::Quantized(s)) = storage else {
            continue;
        };
        let mut host = s.to_host_tensor(q.rows, q.cols, direction);
        if to_swizzled {
            host.swizzle_scales()?;
        } else {
            host.unswizzle_scales()?;
        }
        let relaid = host.data(direction).expect("kept the direction");
        *s = QuantizedStorage::from_host(s.format, relaid, &upload);
    }
    Ok(q)
}

impl LowpBackend for NdArray {
    type Bytes = HostBytes;

    fn lowp_quantize(
        x: FloatTensor<Self>,
        config: &FormatConfig,
        usage: Usage,
        optimize_for_gemm: bool,
    ) -> Result<QuantizedTensor<Self>> {
        let m = to_matrix(x, "input")?;
        check_shape(&m.name, m.rows, m.cols, &config.format())?;
        let mut host = quantize(&m, config, usage)?;
        if optimize_for_gemm && matches!(config, FormatConfig::Mxfp8(_) | FormatConfig::Nvfp4(_)) {
            host.swizzle_scales()?;
        }
        Ok(QuantizedTensor::from_host(&host, upload))
    }

    fn quantize_fp8_with_scale(
        x: FloatTensor<Self>,
        fp8: Fp8Format,
        scale: FloatTensor<Self>,
        usage: Usage,
    ) -> Result<QuantizedTensor<Self>> {
        let m = to_matrix(x, "input")?;
        check_shape(
            &m.name,
            m.rows,
            m.cols,
            &crate::format::QuantFormat::Fp8Tensor { fp8 },
        )?;
        let scale = to_matrix(scale, "scale")?;
        if scale.values.len() != 1 {
            return Err(LowpError::shape(
                "scale",
                format!("{} values", scale.values.len()),
                "a delayed-scaling scale is one value",
            ));
        }
        let host = quantize_fp8_with_scale(&m, fp8, scale.values[0], usage)?;
        Ok(QuantizedTensor::from_host(&host, upload))
    }

    fn lowp_dequantize(
        q: &QuantizedTensor<Self>,
        direction: Direction,
    ) -> Result<FloatTensor<Self>> {
        let storage = match q.require(direction)? {
            Storage::Quantized(storage) => storage,
            Storage::HighPrecision(t) => return Ok(t.clone()),
        };
        let values = storage
            .to_host_tensor(q.rows, q.cols, direction)
            .dequantize(direction)?;
        Ok(NdArrayTensor::from_data(TensorData::new(
            values,
            [q.rows, q.cols],
        )))
    }

    fn swizzle_scales(q: QuantizedTensor<Self>) -> Result<QuantizedTensor<Self>> {
        relayout(q, true)
    }

    fn unswizzle_scales(q: QuantizedTensor<Self>) -> Result<QuantizedTensor<Self>> {
        relayout(q, false)
    }

    fn bytes_to_host(bytes: &Self::Bytes) -> Vec<u8> {
        bytes.as_ref().clone()
    }

    fn float_from_bytes(bytes: &Self::Bytes, shape: [usize; 2]) -> FloatTensor<Self> {
        let values: Vec<f32> = bytes
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        NdArrayTensor::from_data(TensorData::new(values, shape))
    }

    /// Dequantize + f32 matmul. NdArray holds f32 only, so a BF16/F16 output is the f32 result
    /// rounded to that precision (what a GPU writing BF16 stores), kept as f32.
    fn lowp_gemm(
        kind: super::GemmKind,
        a: &QuantizedTensor<Self>,
        b: &QuantizedTensor<Self>,
        options: super::GemmOptions<Self>,
    ) -> Result<FloatTensor<Self>> {
        use burn::tensor::FloatDType;
        let wanted = options.out_dtype;
        let out = super::gemm::dequantize_matmul(
            kind,
            a,
            b,
            FloatDType::F32,
            super::GemmOptions {
                out_dtype: FloatDType::F32,
                accumulate: options.accumulate,
            },
        )?;
        let dtype = match wanted {
            FloatDType::BF16 => InputDtype::BF16,
            FloatDType::F16 => InputDtype::F16,
            _ => return Ok(out),
        };
        let m = to_matrix(out, "GEMM output")?;
        let rounded = m.values.iter().map(|&v| dtype.round(v)).collect();
        Ok(NdArrayTensor::from_data(TensorData::new(
            rounded,
            [m.rows, m.cols],
        )))
    }

    fn float_from_host(m: &HostMatrix, _device: &Self::Device) -> FloatTensor<Self> {
        NdArrayTensor::from_data(TensorData::new(m.values.clone(), [m.rows, m.cols]))
    }
}
