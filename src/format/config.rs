//! One quantizer configuration per format, and the reference `quantize` that dispatches on it.

use super::fp8_block::{quantize_fp8_block, Fp8BlockScaling, FP8_BLOCK};
use super::fp8_tensor::{quantize_fp8_current, Fp8CurrentScaling};
use super::matrix::HostMatrix;
use super::mxfp8::{quantize_mxfp8, round_up, Mxfp8Config, MXFP8_BLOCK};
use super::nvfp4::{quantize_nvfp4, Nvfp4Config, NVFP4_BLOCK};
use super::quantized::{Direction, HostQuantized, QuantFormat, Usage};
use crate::error::{LowpError, Result};

/// How to quantize: a format and its options.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum FormatConfig {
    Fp8Current(Fp8CurrentScaling),
    Fp8Block(Fp8BlockScaling),
    Mxfp8(Mxfp8Config),
    Nvfp4(Nvfp4Config),
}

impl FormatConfig {
    pub fn format(&self) -> QuantFormat {
        match self {
            FormatConfig::Fp8Current(c) => QuantFormat::Fp8Tensor { fp8: c.fp8 },
            FormatConfig::Fp8Block(c) => QuantFormat::Fp8Block {
                fp8: c.fp8,
                block: c.block,
            },
            FormatConfig::Mxfp8(c) => QuantFormat::Mxfp8 {
                fp8: c.fp8,
                block_2d: c.block_2d,
            },
            FormatConfig::Nvfp4(c) => c.format(),
        }
    }
}

/// The reference quantizer for `config`.
pub fn quantize(x: &HostMatrix, config: &FormatConfig, usage: Usage) -> Result<HostQuantized> {
    match config {
        FormatConfig::Fp8Current(c) => quantize_fp8_current(x, c, usage),
        FormatConfig::Fp8Block(c) => quantize_fp8_block(x, c, usage),
        FormatConfig::Mxfp8(c) => quantize_mxfp8(x, c, usage),
        FormatConfig::Nvfp4(c) => quantize_nvfp4(x, c, usage),
    }
}

/// The shape rules every backend enforces for `format` on a `[rows, cols]` matrix: TE's block
/// divisibility, plus M and K divisible by 16 for FP8 per-tensor (the cuBLASLt FP8 alignment the
/// kernels rely on), and at most 2^32 elements.
pub fn check_shape(tensor: &str, rows: usize, cols: usize, format: &QuantFormat) -> Result<()> {
    let (row_block, col_block) = match format {
        QuantFormat::Fp8Tensor { .. } => (16, 16),
        QuantFormat::Fp8Block { .. } => (FP8_BLOCK, FP8_BLOCK),
        QuantFormat::Mxfp8 { .. } => (MXFP8_BLOCK, MXFP8_BLOCK),
        QuantFormat::Nvfp4 { .. } => (NVFP4_BLOCK, NVFP4_BLOCK),
    };
    let name = format.name();
    if rows == 0 || cols == 0 {
        return Err(LowpError::shape(
            tensor,
            format!("shape [{rows}, {cols}]"),
            format!("{name} needs a non-empty matrix"),
        ));
    }
    if cols % col_block != 0 {
        return Err(LowpError::shape(
            tensor,
            format!("K = {cols} (last dimension)"),
            format!("{name} needs K divisible by {col_block}"),
        ));
    }
    if rows % row_block != 0 {
        return Err(LowpError::shape(
            tensor,
            format!("M = {rows} (product of the leading dimensions)"),
            format!("{name} needs M divisible by {row_block}"),
        ));
    }
    if rows.saturating_mul(cols) >= u32::MAX as usize {
        return Err(LowpError::shape(
            tensor,
            format!("{} elements", rows * cols),
            "quantize kernels index elements with 32 bits",
        ));
    }
    if let QuantFormat::Nvfp4 {
        block_2d: true,
        rht: true,
        ..
    } = format
    {
        return Err(LowpError::invalid(
            format!("NVFP4 options for tensor `{tensor}`"),
            "16x16 blocks with RHT",
            "RHT applies to 1x16 activations and gradients; 16x16 blocks are for weights",
        ));
    }
    Ok(())
}

/// Shape of one representation's codes, in bytes.
pub fn codes_shape(
    format: &QuantFormat,
    rows: usize,
    cols: usize,
    direction: Direction,
) -> [usize; 2] {
    let transposed = match format {
        QuantFormat::Mxfp8 { .. } => false,
        _ => direction == Direction::Columnwise,
    };
    let [r, c] = if transposed {
        [cols, rows]
    } else {
        [rows, cols]
    };
    match format {
        QuantFormat::Nvfp4 { .. } => [r, c / 2],
        _ => [r, c],
    }
}

/// Shape of one representation's block scales (compact, padded), or `[1, 1]` for a tensor scale.
pub fn scales_shape(
    format: &QuantFormat,
    rows: usize,
    cols: usize,
    direction: Direction,
) -> [usize; 2] {
    let rowwise = direction == Direction::Rowwise;
    match format {
        QuantFormat::Fp8Tensor { .. } => [1, 1],
        QuantFormat::Fp8Block { block, .. } => {
            let [r, c] = if rowwise { [rows, cols] } else { [cols, rows] };
            match block {
                super::fp8_block::BlockShape::OneByOneTwentyEight => [r, c / FP8_BLOCK],
                super::fp8_block::BlockShape::OneTwentyEightSquare => {
                    [r / FP8_BLOCK, c / FP8_BLOCK]
                }
            }
        }
        QuantFormat::Mxfp8 { .. } => {
            if rowwise {
                [round_up(rows, 128), round_up(cols / 32, 4)]
            } else {
                [round_up(rows / 32, 4), round_up(cols, 128)]
            }
        }
        QuantFormat::Nvfp4 { .. } => {
            let [r, c] = if rowwise { [rows, cols] } else { [cols, rows] };
            [round_up(r, 128), round_up(c / 16, 4)]
        }
    }
}
