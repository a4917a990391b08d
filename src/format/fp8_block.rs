//! FP8 block scaling (DeepSeek-v3 style, TE `Float8BlockScaling`): one f32 scale per 1x128 block
//! (activations, gradients) or per 128x128 tile (weights), power-of-two scales by default.
//!
//! Per block: `scale = compute_scale_from_amax(block_amax)` with `value_for_inf` the input dtype's
//! largest finite value; `q = rne_sat(x * scale)`; `scale_inv = 1 / scale` is stored.
//!
//! Layouts (compact, row-major f32 scales):
//! * rowwise codes `[M, K]`; scales `[M, K/128]` (1x128) or `[M/128, K/128]` (128x128);
//! * columnwise codes are the transpose `[K, M]` with blocks along M, as Hopper's TN-only FP8 GEMM
//!   needs; scales `[K, M/128]` (1x128) or `[K/128, M/128]` (128x128).
//! With 128x128 tiles the columnwise codes equal the transposed rowwise codes (same tile scale),
//! with 1x128 blocks they differ and are quantized independently from the source.

use super::codec::Fp8Format;
use super::matrix::HostMatrix;
use super::quantized::{HostQuantized, QuantFormat, QuantizedData, Scales, Usage};
use super::scaling::{compute_scale_from_amax, fmaxf, ScaleRule};
use crate::error::{LowpError, Result};

/// Elements per block side.
pub const FP8_BLOCK: usize = 128;

/// Block shape of FP8 block scaling.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum BlockShape {
    /// 1x128 blocks along the contraction dimension (TE `block_scaling_dim = 1`).
    #[serde(rename = "1x128")]
    OneByOneTwentyEight,
    /// 128x128 tiles (TE `block_scaling_dim = 2`).
    #[serde(rename = "128x128")]
    OneTwentyEightSquare,
}

impl BlockShape {
    pub fn name(self) -> &'static str {
        match self {
            BlockShape::OneByOneTwentyEight => "1x128",
            BlockShape::OneTwentyEightSquare => "128x128",
        }
    }

    /// Rows covered by one block (of the matrix it scales along).
    fn rows(self) -> usize {
        match self {
            BlockShape::OneByOneTwentyEight => 1,
            BlockShape::OneTwentyEightSquare => FP8_BLOCK,
        }
    }
}

/// Options of FP8 block scaling.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Fp8BlockScaling {
    pub fp8: Fp8Format,
    pub block: BlockShape,
    /// Power-of-two scales (TE's default; `NVTE_FP8_BLOCK_SCALING_FP32_SCALES` turns them off).
    pub pow2_scales: bool,
    pub amax_epsilon: f32,
}

impl Fp8BlockScaling {
    pub fn new(fp8: Fp8Format, block: BlockShape) -> Self {
        Fp8BlockScaling {
            fp8,
            block,
            pow2_scales: true,
            amax_epsilon: 0.0,
        }
    }
}

pub fn quantize_fp8_block(
    x: &HostMatrix,
    config: &Fp8BlockScaling,
    usage: Usage,
) -> Result<HostQuantized> {
    // TE requires both dimensions to be multiples of 128 whatever the block shape.
    x.require_blocks(
        FP8_BLOCK,
        FP8_BLOCK,
        &format!("FP8 block scaling {}", config.block.name()),
    )?;
    let block_rows = config.block.rows();
    let rule = ScaleRule {
        fp8_max: config.fp8.max(),
        pow2: config.pow2_scales,
        epsilon: config.amax_epsilon,
        value_for_inf: x.dtype.max_finite(),
    };
    let rowwise = usage.rowwise.then(|| {
        let (codes, scales) = quantize_blocks(x, block_rows, config.fp8, &rule);
        QuantizedData {
            codes,
            codes_shape: [x.rows, x.cols],
            scales,
            amax: None,
        }
    });
    let columnwise = usage.columnwise.then(|| {
        let (codes, scales) = quantize_blocks(&x.transpose(), block_rows, config.fp8, &rule);
        QuantizedData {
            codes,
            codes_shape: [x.cols, x.rows],
            scales,
            amax: None,
        }
    });
    Ok(HostQuantized {
        format: QuantFormat::Fp8Block {
            fp8: config.fp8,
            block: config.block,
        },
        rows: x.rows,
        cols: x.cols,
        rowwise,
        columnwise,
    })
}

/// Quantizes `m` with blocks of `block_rows x 128` along its rows; returns codes in `m`'s layout
/// and the `scale_inv` matrix `[rows / block_rows, cols / 128]`.
fn quantize_blocks(
    m: &HostMatrix,
    block_rows: usize,
    fp8: Fp8Format,
    rule: &ScaleRule,
) -> (Vec<u8>, Scales) {
    let grid = [m.rows / block_rows, m.cols / FP8_BLOCK];
    let mut block_amax = vec![0.0f32; grid[0] * grid[1]];
    for r in 0..m.rows {
        for c in 0..m.cols {
            let b = (r / block_rows) * grid[1] + c / FP8_BLOCK;
            block_amax[b] = fmaxf(block_amax[b], m.at(r, c).abs());
        }
    }
    let scales: Vec<f32> = block_amax
        .iter()
        .map(|&a| compute_scale_from_amax(a, rule))
        .collect();
    let mut codes = Vec::with_capacity(m.values.len());
    for r in 0..m.rows {
        for c in 0..m.cols {
            let scale = scales[(r / block_rows) * grid[1] + c / FP8_BLOCK];
            codes.push(fp8.encode(m.at(r, c) * scale));
        }
    }
    let scale_inv = scales.iter().map(|&s| 1.0 / s).collect();
    (
        codes,
        Scales::BlockF32 {
            shape: grid,
            values: scale_inv,
        },
    )
}

/// Dequantizes one representation in its own layout (`[M, K]` rowwise, `[K, M]` columnwise).
pub(crate) fn dequantize_codes(
    fp8: Fp8Format,
    block: BlockShape,
    data: &QuantizedData,
) -> Result<Vec<f32>> {
    let Scales::BlockF32 { shape, values } = &data.scales else {
        return Err(LowpError::invalid(
            "scales",
            "not f32 block scales",
            "FP8 block data needs f32 block scales",
        ));
    };
    let [rows, cols] = data.codes_shape;
    let block_rows = block.rows();
    if shape[0] * block_rows != rows || shape[1] * FP8_BLOCK != cols {
        return Err(LowpError::invalid(
            "FP8 block scale shape",
            format!("{shape:?} for codes [{rows}, {cols}]"),
            format!("needs [{}, {}]", rows / block_rows, cols / FP8_BLOCK),
        ));
    }
    let mut out = Vec::with_capacity(rows * cols);
    for r in 0..rows {
        for c in 0..cols {
            let s = values[(r / block_rows) * shape[1] + c / FP8_BLOCK];
            out.push(fp8.decode(data.codes[r * cols + c]) * s);
        }
    }
    Ok(out)
}
