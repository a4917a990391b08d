//! `QuantizeOps` on `NdArray`: the host reference quantizers of `format` (bit-exact with TE) on
//! the tensor read back as f32, and the scales' swizzle on the host.

use burn::backend::ndarray::{NdArray, NdArrayTensor};
use burn::tensor::ops::FloatTensor;
use burn::tensor::TensorData;

use super::{scale_values, to_matrix, upload};
use crate::backend::{
    AmaxHistoryColumns, QuantizeOps, QuantizedStorage, QuantizedTensor, ScaleColumns, Storage,
};
use crate::error::Result;
use crate::format::{
    check_shape, quantize, quantize_fp8_with_scale, Direction, FormatConfig, Fp8Format,
    QuantFormat, Usage,
};

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

impl QuantizeOps<Self> for NdArray {
    fn quantize_tensor(
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
        scale: ScaleColumns<Self>,
        usage: Usage,
        _record: Option<AmaxHistoryColumns<Self>>,
    ) -> Result<QuantizedTensor<Self>> {
        let m = to_matrix(x, "input")?;
        check_shape(
            &m.name,
            m.rows,
            m.cols,
            &QuantFormat::Fp8Tensor { fp8 },
        )?;
        let scale = scale_values(scale, 1)?[0];
        let host = quantize_fp8_with_scale(&m, fp8, scale, usage)?;
        Ok(QuantizedTensor::from_host(&host, upload))
    }

    fn quantize_dequantize(
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

    fn quantize_swizzle_scales(q: QuantizedTensor<Self>) -> Result<QuantizedTensor<Self>> {
        relayout(q, true)
    }

    fn quantize_unswizzle_scales(q: QuantizedTensor<Self>) -> Result<QuantizedTensor<Self>> {
        relayout(q, false)
    }
}
