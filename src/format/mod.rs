//! The executable spec: pure-Rust reference quantizers for every format, bit-exact with NVIDIA
//! Transformer Engine's numerics (the semantics are summarised in `docs/formats.md`).
//!
//! Written for reading, step by step, like TE's `reference_nvfp4.py`; the CubeCL kernels are held
//! to these functions bit for bit.

pub mod codec;
pub mod config;
pub mod fp8_block;
pub mod fp8_tensor;
pub mod grouped;
pub mod hadamard;
pub mod matrix;
pub mod mxfp8;
pub mod nvfp4;
pub mod quantized;
pub mod random;
pub mod scaling;
pub mod swizzle;

pub use codec::Fp8Format;
pub use config::{check_shape, codes_shape, quantize, scales_shape, FormatConfig};
pub use fp8_block::{quantize_fp8_block, BlockShape, Fp8BlockScaling};
pub use fp8_tensor::{quantize_fp8_current, quantize_fp8_with_scale, Fp8CurrentScaling};
pub use matrix::{HostMatrix, InputDtype};
pub use mxfp8::{quantize_mxfp8, Mxfp8Config};
pub use nvfp4::{quantize_nvfp4, Nvfp4Config};
pub use quantized::{
    Direction, HostQuantized, QuantFormat, QuantizedData, ScaleLayout, Scales, Usage,
};

use crate::error::{LowpError, Result};

impl HostQuantized {
    /// Dequantizes one representation back to the logical row-major `[rows, cols]` matrix
    /// (columnwise copies are transposed back, and NVFP4's RHT is undone). Block scales must be in
    /// the compact layout.
    pub fn dequantize(&self, direction: Direction) -> Result<Vec<f32>> {
        let data = self.data(direction).ok_or_else(|| {
            LowpError::invalid(
                "direction",
                direction.name(),
                format!(
                    "this {} tensor holds no {} data",
                    self.format.name(),
                    direction.name()
                ),
            )
        })?;
        let rowwise = direction == Direction::Rowwise;
        let values = match self.format {
            QuantFormat::Fp8Tensor { fp8 } => fp8_tensor::dequantize_codes(fp8, data)?,
            QuantFormat::Fp8Block { fp8, block } => fp8_block::dequantize_codes(fp8, block, data)?,
            QuantFormat::Mxfp8 { fp8, .. } => return mxfp8::dequantize_codes(fp8, rowwise, data),
            QuantFormat::Nvfp4 { rht, .. } => return nvfp4::dequantize_codes(rowwise, rht, data),
        };
        // FP8 per-tensor and block columnwise codes are stored transposed `[K, M]`.
        Ok(if rowwise {
            values
        } else {
            matrix::transpose(&values, self.cols, self.rows)
        })
    }

    /// Rewrites MXFP8/NVFP4 block scales into the GEMM-swizzled layout (no-op if already there).
    /// MXFP8 columnwise scales `[M/32, K]` are swizzled as their transpose `[K, M/32]`, since the
    /// GEMM reads them with K as the outer dimension (TE `swizzle.cu`).
    pub fn swizzle_scales(&mut self) -> Result<()> {
        self.relayout_scales(ScaleLayout::Swizzled)
    }

    /// Rewrites swizzled block scales back into the compact layout (no-op if already compact).
    pub fn unswizzle_scales(&mut self) -> Result<()> {
        self.relayout_scales(ScaleLayout::Compact)
    }

    fn relayout_scales(&mut self, target: ScaleLayout) -> Result<()> {
        let transposed_columnwise = match self.format {
            QuantFormat::Mxfp8 { .. } => true,
            QuantFormat::Nvfp4 { .. } => false,
            _ => {
                return Err(LowpError::invalid(
                    "scale layout",
                    format!("{target:?}"),
                    format!(
                        "only MXFP8 and NVFP4 have swizzled block scales, not {}",
                        self.format.name()
                    ),
                ))
            }
        };
        for (data, transposed) in [
            (self.rowwise.as_mut(), false),
            (self.columnwise.as_mut(), transposed_columnwise),
        ] {
            let Some(data) = data else { continue };
            let Scales::BlockBytes {
                shape,
                bytes,
                layout,
            } = &mut data.scales
            else {
                continue;
            };
            if *layout == target {
                continue;
            }
            let [rows, cols] = *shape;
            *bytes = match (target, transposed) {
                (ScaleLayout::Swizzled, false) => swizzle::swizzle(bytes, rows, cols)?,
                (ScaleLayout::Swizzled, true) => {
                    swizzle::swizzle(&matrix::transpose(bytes, rows, cols), cols, rows)?
                }
                (ScaleLayout::Compact, false) => swizzle::unswizzle(bytes, rows, cols)?,
                (ScaleLayout::Compact, true) => {
                    matrix::transpose(&swizzle::unswizzle(bytes, cols, rows)?, cols, rows)
                }
            };
            *layout = target;
        }
        Ok(())
    }
}
