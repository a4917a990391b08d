//! `GemmOps` on `NdArray`: the dequantize-and-matmul reference in f32, its output rounded to the
//! requested BF16/F16 precision as a GPU writing it would store it (NdArray holds f32 only).

use burn::backend::ndarray::{NdArray, NdArrayTensor};
use burn::tensor::ops::FloatTensor;
use burn::tensor::TensorData;

use super::to_matrix;
use crate::backend::ops::gemm::dequantize_matmul;
use crate::backend::{GemmKind, GemmOps, GemmOptions, QuantizedTensor};
use crate::error::Result;
use crate::format::InputDtype;

impl GemmOps<Self> for NdArray {
    /// Dequantize + f32 matmul. NdArray holds f32 only, so a BF16/F16 output is the f32 result
    /// rounded to that precision (what a GPU writing BF16 stores), kept as f32.
    fn gemm_quantized(
        kind: GemmKind,
        a: &QuantizedTensor<Self>,
        b: &QuantizedTensor<Self>,
        options: GemmOptions<Self>,
    ) -> Result<FloatTensor<Self>> {
        use burn::tensor::FloatDType;
        let wanted = options.out_dtype;
        let out = dequantize_matmul(
            kind,
            a,
            b,
            FloatDType::F32,
            GemmOptions {
                out_dtype: FloatDType::F32,
                accumulate: options.accumulate,
                split_accumulator: options.split_accumulator,
                // Added in f32, before the one rounding below (as cuBLASLt's epilogue does).
                bias: options.bias,
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
}
