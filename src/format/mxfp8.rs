//! MXFP8 (OCP microscaling): FP8 elements with one E8M0 (power-of-two) scale per 32 elements.
//!
//! Per block (TE `quantize_mxfp8.cuh`):
//! 1. `block_amax = max |x|` over the 32 elements (or the 32x32 tile with 2D blocks), in f32;
//! 2. `e = float_to_e8m0(block_amax * (1 / fp8_max))`, rounding *up* so nothing overflows;
//! 3. `q = rne_sat(x * 2^(127 - e))`, the multiplier built from exponent bits (`exp2f_rcp`);
//! 4. dequantize `x ~= q * 2^(e - 127)`.
//!
//! Rowwise blocks are 1x32 along K, columnwise blocks 32x1 along M; both are quantized from the
//! source, and columnwise codes stay in the `[M, K]` layout. Compact scales are zero-padded:
//! rowwise `[roundup(M, 128), roundup(K/32, 4)]`, columnwise `[roundup(M/32, 4), roundup(K, 128)]`.

use super::codec::{e8m0_reciprocal, e8m0_to_f32, float_to_e8m0, Fp8Format};
use super::matrix::HostMatrix;
use super::quantized::{HostQuantized, QuantFormat, QuantizedData, ScaleLayout, Scales, Usage};
use super::scaling::{amax, fmaxf};
use crate::error::{LowpError, Result};

/// Elements per MXFP8 block.
pub const MXFP8_BLOCK: usize = 32;

/// Options of MXFP8 quantization.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mxfp8Config {
    pub fp8: Fp8Format,
    /// One scale per 32x32 tile (TE `enable_2d_quantization`, for weights).
    pub block_2d: bool,
}

pub fn round_up(v: usize, multiple: usize) -> usize {
    v.div_ceil(multiple) * multiple
}

/// `1 / fp8_max` as the f32 constant TE multiplies by.
fn reciprocal_max(fp8: Fp8Format) -> f32 {
    1.0 / fp8.max()
}

/// The E8M0 scale of a block whose amax is `block_amax`.
pub fn mxfp8_block_scale(block_amax: f32, fp8: Fp8Format) -> u8 {
    float_to_e8m0(block_amax * reciprocal_max(fp8))
}

pub fn quantize_mxfp8(x: &HostMatrix, config: &Mxfp8Config, usage: Usage) -> Result<HostQuantized> {
    x.require_blocks(MXFP8_BLOCK, MXFP8_BLOCK, "MXFP8")?;
    let (m, k) = (x.rows, x.cols);
    // Block amaxes: rowwise [M, K/32], columnwise [M/32, K]; with 2D blocks both read the tile.
    let mut tile_amax = vec![0.0f32; (m / 32) * (k / 32)];
    if config.block_2d {
        for r in 0..m {
            for c in 0..k {
                let t = (r / 32) * (k / 32) + c / 32;
                tile_amax[t] = fmaxf(tile_amax[t], x.at(r, c).abs());
            }
        }
    }

    let rowwise = usage.rowwise.then(|| {
        let shape = [round_up(m, 128), round_up(k / 32, 4)];
        let mut scales = vec![0u8; shape[0] * shape[1]];
        let mut codes = vec![0u8; m * k];
        for r in 0..m {
            for kb in 0..k / 32 {
                let block = &x.values[r * k + kb * 32..r * k + kb * 32 + 32];
                let block_amax = if config.block_2d {
                    tile_amax[(r / 32) * (k / 32) + kb]
                } else {
                    amax(block)
                };
                let e = mxfp8_block_scale(block_amax, config.fp8);
                let multiplier = e8m0_reciprocal(e);
                scales[r * shape[1] + kb] = e;
                for (i, &v) in block.iter().enumerate() {
                    codes[r * k + kb * 32 + i] = config.fp8.encode(v * multiplier);
                }
            }
        }
        QuantizedData {
            codes,
            codes_shape: [m, k],
            scales: Scales::BlockBytes {
                shape,
                bytes: scales,
                layout: ScaleLayout::Compact,
            },
            amax: None,
        }
    });

    let columnwise = usage.columnwise.then(|| {
        let shape = [round_up(m / 32, 4), round_up(k, 128)];
        let mut scales = vec![0u8; shape[0] * shape[1]];
        let mut codes = vec![0u8; m * k];
        for mb in 0..m / 32 {
            for c in 0..k {
                let block_amax = if config.block_2d {
                    tile_amax[mb * (k / 32) + c / 32]
                } else {
                    (0..32).fold(0.0f32, |a, i| fmaxf(a, x.at(mb * 32 + i, c).abs()))
                };
                let e = mxfp8_block_scale(block_amax, config.fp8);
                let multiplier = e8m0_reciprocal(e);
                scales[mb * shape[1] + c] = e;
                for i in 0..32 {
                    let r = mb * 32 + i;
                    codes[r * k + c] = config.fp8.encode(x.at(r, c) * multiplier);
                }
            }
        }
        QuantizedData {
            codes,
            codes_shape: [m, k],
            scales: Scales::BlockBytes {
                shape,
                bytes: scales,
                layout: ScaleLayout::Compact,
            },
            amax: None,
        }
    });

    Ok(HostQuantized {
        format: QuantFormat::Mxfp8 {
            fp8: config.fp8,
            block_2d: config.block_2d,
        },
        rows: m,
        cols: k,
        rowwise,
        columnwise,
    })
}

/// Dequantizes one representation (compact scales) to the logical `[M, K]` layout.
pub(crate) fn dequantize_codes(
    fp8: Fp8Format,
    rowwise: bool,
    data: &QuantizedData,
) -> Result<Vec<f32>> {
    let (shape, bytes) = match &data.scales {
        Scales::BlockBytes {
            shape,
            bytes,
            layout: ScaleLayout::Compact,
        } => (shape, bytes),
        _ => {
            return Err(LowpError::invalid(
                "MXFP8 scales",
                "not compact E8M0 bytes",
                "dequantize reads compact scales: unswizzle them first",
            ))
        }
    };
    let [m, k] = data.codes_shape;
    let expected = if rowwise {
        [round_up(m, 128), round_up(k / 32, 4)]
    } else {
        [round_up(m / 32, 4), round_up(k, 128)]
    };
    if *shape != expected || bytes.len() != shape[0] * shape[1] {
        return Err(LowpError::invalid(
            "MXFP8 scale shape",
            format!("{shape:?}"),
            format!("codes [{m}, {k}] need {expected:?}"),
        ));
    }
    let mut out = Vec::with_capacity(m * k);
    for r in 0..m {
        for c in 0..k {
            let e = if rowwise {
                bytes[r * shape[1] + c / 32]
            } else {
                bytes[(r / 32) * shape[1] + c]
            };
            out.push(fp8.decode(data.codes[r * k + c]) * e8m0_to_f32(e));
        }
    }
    Ok(out)
}
