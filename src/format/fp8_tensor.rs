//! FP8 with one scale per tensor: current scaling (scale from this tensor's amax) and quantize
//! with a given scale (delayed scaling, where the scale comes from the amax history).
//!
//! `q = rne_sat(x * scale)` with the product in f32; `scale_inv = 1 / scale` is stored. The
//! columnwise copy is the physical transpose `[K, M]` of the rowwise codes with the same scale,
//! because Hopper FP8 GEMMs only take the TN layout.

use super::codec::Fp8Format;
use super::matrix::{transpose, HostMatrix};
use super::quantized::{HostQuantized, QuantFormat, QuantizedData, Scales, Usage};
use super::scaling::{amax, compute_scale_from_amax, ScaleRule};
use crate::error::{LowpError, Result};

/// Options of FP8 current scaling (TE `Float8CurrentScaling`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Fp8CurrentScaling {
    pub fp8: Fp8Format,
    /// Round the scale down to a power of two (`NVTE_FP8_CURRENT_SCALING_POWER_2_SCALES`).
    pub pow2_scales: bool,
    /// Lower bound on the amax (TE's `amax_epsilon`, default 0).
    pub amax_epsilon: f32,
}

impl Fp8CurrentScaling {
    pub fn new(fp8: Fp8Format) -> Self {
        Fp8CurrentScaling {
            fp8,
            pow2_scales: false,
            amax_epsilon: 0.0,
        }
    }

    /// The scale this configuration picks for a tensor whose amax is `amax`.
    pub fn scale_for(&self, amax: f32) -> f32 {
        compute_scale_from_amax(
            amax,
            &ScaleRule {
                fp8_max: self.fp8.max(),
                pow2: self.pow2_scales,
                epsilon: self.amax_epsilon,
                value_for_inf: f32::MAX,
            },
        )
    }
}

/// Current scaling: amax pass, scale from the amax, cast pass.
pub fn quantize_fp8_current(
    x: &HostMatrix,
    config: &Fp8CurrentScaling,
    usage: Usage,
) -> Result<HostQuantized> {
    let scale = config.scale_for(amax(&x.values));
    quantize_fp8_with_scale(x, config.fp8, scale, usage)
}

/// Quantize with a scale chosen elsewhere (delayed scaling). The result records this tensor's amax,
/// which the delayed-scaling history consumes.
pub fn quantize_fp8_with_scale(
    x: &HostMatrix,
    fp8: Fp8Format,
    scale: f32,
    usage: Usage,
) -> Result<HostQuantized> {
    if !(scale.is_finite() && scale > 0.0) {
        return Err(LowpError::invalid(
            format!("FP8 scale for tensor `{}`", x.name),
            scale,
            "a scale must be finite and positive",
        ));
    }
    if x.values.is_empty() {
        return Err(LowpError::shape(
            &x.name,
            format!("shape [{}, {}]", x.rows, x.cols),
            "FP8 quantization needs a non-empty matrix",
        ));
    }
    let tensor_amax = amax(&x.values);
    let codes: Vec<u8> = x.values.iter().map(|&v| fp8.encode(v * scale)).collect();
    let scale_inv = 1.0 / scale;
    let columnwise = usage.columnwise.then(|| QuantizedData {
        codes: transpose(&codes, x.rows, x.cols),
        codes_shape: [x.cols, x.rows],
        scales: Scales::TensorScaleInv(scale_inv),
        amax: Some(tensor_amax),
    });
    let rowwise = usage.rowwise.then(|| QuantizedData {
        codes,
        codes_shape: [x.rows, x.cols],
        scales: Scales::TensorScaleInv(scale_inv),
        amax: Some(tensor_amax),
    });
    Ok(HostQuantized {
        format: QuantFormat::Fp8Tensor { fp8 },
        rows: x.rows,
        cols: x.cols,
        rowwise,
        columnwise,
    })
}

/// `code * scale_inv` for every code of one representation, in its own layout.
pub(crate) fn dequantize_codes(fp8: Fp8Format, data: &QuantizedData) -> Result<Vec<f32>> {
    let Scales::TensorScaleInv(scale_inv) = data.scales else {
        return Err(LowpError::invalid(
            "scales",
            "block scales",
            "FP8 per-tensor data needs one tensor scale_inv",
        ));
    };
    Ok(data
        .codes
        .iter()
        .map(|&c| fp8.decode(c) * scale_inv)
        .collect())
}
