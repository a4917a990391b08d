//! How much a quantization loses, measured as TE's debug tools measure it
//! (`debug/features/utils/stats_computation.py`, AutoswitchGemm).

use crate::error::{LowpError, Result};

/// Quality of one quantized tensor against its high-precision source.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct QuantizationError {
    /// `100 * count(x != 0 and dequantized == 0) / numel`: values flushed to zero.
    pub underflow_pct: f64,
    /// `mean((x - dequantized)^2)`.
    pub mse: f64,
}

impl QuantizationError {
    /// Compares a source with its dequantized copy (same layout, same length). Pairs whose
    /// difference is not finite (NaN or Inf inputs) are left out of the MSE.
    pub fn measure(source: &[f32], dequantized: &[f32]) -> Result<QuantizationError> {
        if source.len() != dequantized.len() {
            return Err(LowpError::shape(
                "dequantized",
                format!("{} values", dequantized.len()),
                format!("must match the source's {} values", source.len()),
            ));
        }
        let n = source.len().max(1) as f64;
        let mut underflows = 0usize;
        let mut squared = 0.0f64;
        for (&x, &q) in source.iter().zip(dequantized) {
            if x != 0.0 && q == 0.0 {
                underflows += 1;
            }
            let d = x as f64 - q as f64;
            if d.is_finite() {
                squared += d * d;
            }
        }
        Ok(QuantizationError {
            underflow_pct: 100.0 * underflows as f64 / n,
            mse: squared / n,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_flushed_values_and_squared_error() {
        let e = QuantizationError::measure(&[0.0, 1.0, 2.0, 0.001], &[0.0, 1.0, 1.5, 0.0]).unwrap();
        assert!(QuantizationError::measure(&[1.0], &[]).is_err());
        assert_eq!(e.underflow_pct, 25.0);
        assert!((e.mse - (0.25 + 1e-6) / 4.0).abs() < 1e-12);
    }
}
