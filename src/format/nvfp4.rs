//! NVFP4: E2M1 (FP4) elements, one E4M3 scale per 16 elements (or per 16x16 tile), and an f32
//! global scale from the tensor's amax. Follows TE's `reference_nvfp4.py` step by step:
//!
//! 1. `S_enc = (448 * 6) / amax`, capped at f32::MAX; an amax of 0 (or an `S_enc` of 0) gives 1;
//!    `S_dec = 1 / S_enc`.
//! 2. Per block: `s_b = e4m3(min(block_amax * (S_enc * (1/6)), 448))` (round to nearest even).
//! 3. `enc = min(1 / (float(s_b) * S_dec), f32::MAX)`; `q = e2m1(clamp(x * enc, -6, 6))` with
//!    round-to-nearest-even, or stochastic rounding for gradients.
//! 4. Dequantize: `x ~= e2m1(q) * (float(s_b) * S_dec)` (with RHT, the inverse transform is applied
//!    to the E2M1 values before the scale).
//!
//! Codes pack two per byte, the even element in the low nibble. Rowwise codes `[M, K/2]`, scales
//! `[roundup(M,128), roundup(K/16,4)]`. Columnwise is the transpose `xᵀ` quantized the same way:
//! codes `[K, M/2]`, scales `[roundup(K,128), roundup(M/16,4)]`; with RHT, `xᵀ` is first transformed
//! in 16-element chunks along M and the columnwise amax is taken after the transform.
//! With 16x16 blocks (weights) the tile's scale is repeated on each of its 16 rows, so rowwise and
//! columnwise codes describe the same values.

use super::codec::{decode_e2m1, encode_e2m1, Fp8Format};
use super::hadamard::{inverse_rht_rows, rht_rows, RHT_SIZE};
use super::matrix::{transpose, HostMatrix};
use super::mxfp8::round_up;
use super::quantized::{HostQuantized, QuantFormat, QuantizedData, ScaleLayout, Scales, Usage};
use super::random::{random_byte, stream_key, COLUMNWISE_STREAM, ROWWISE_STREAM};
use super::scaling::{amax, fmaxf};
use crate::error::{LowpError, Result};

/// Elements per NVFP4 block.
pub const NVFP4_BLOCK: usize = 16;
/// `fp8_max * fp4_max`: the global-scale numerator.
pub const NVFP4_GLOBAL_NUMERATOR: f32 = 448.0 * 6.0;

/// Options of NVFP4 quantization.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Nvfp4Config {
    /// 16x16 tiles (TE's default for weights) instead of 1x16 blocks.
    pub block_2d: bool,
    /// Random Hadamard transform on the columnwise copy (activations and gradients).
    pub rht: bool,
    /// Stochastic rounding with this seed (gradients); `None` rounds to nearest even.
    pub stochastic_seed: Option<u64>,
}

impl Nvfp4Config {
    pub fn format(&self) -> QuantFormat {
        QuantFormat::Nvfp4 {
            block_2d: self.block_2d,
            rht: self.rht,
            stochastic_rounding: self.stochastic_seed.is_some(),
        }
    }
}

/// The global encode scale `S_enc` for a tensor amax.
pub fn global_encode_scale(amax: f32) -> f32 {
    if amax == 0.0 {
        return 1.0;
    }
    let s = (NVFP4_GLOBAL_NUMERATOR / amax).min(f32::MAX);
    if s == 0.0 || s.is_nan() {
        1.0
    } else {
        s
    }
}

/// The E4M3 block scale byte for a block amax under global encode scale `s_enc`.
pub fn block_scale(block_amax: f32, s_enc: f32) -> u8 {
    let multiplier = s_enc * (1.0f32 / 6.0);
    let d = (block_amax * multiplier).min(f32::MAX).min(448.0);
    Fp8Format::E4M3.encode(d)
}

/// The element multiplier of a block: `min(1 / (s_b * S_dec), f32::MAX)`.
pub fn element_encode_scale(scale_byte: u8, s_dec: f32) -> f32 {
    (1.0 / (Fp8Format::E4M3.decode(scale_byte) * s_dec)).min(f32::MAX)
}

/// Stochastic rounding to the E2M1 grid with 8 random bits (TE `stochastic_round_fp4_e2m1`'s
/// software path): round `|x|` up with probability equal to its distance from the grid point below,
/// in units of the local grid step; saturate at 6.
pub fn stochastic_round_e2m1(x: f32, random: u32) -> u8 {
    if x.is_nan() {
        return 0;
    }
    let a = x.abs();
    let u = random as f32 * (1.0 / 256.0);
    let step = |v: f32| {
        if v >= 4.0 {
            2.0
        } else if v >= 2.0 {
            1.0
        } else {
            0.5
        }
    };
    let t = a + u * step(a);
    let step_t = step(t);
    let q = ((t / step_t).floor() * step_t).min(6.0);
    encode_e2m1(if x < 0.0 { -q } else { q })
}

/// TE's rules: both dimensions divisible by 16; RHT only on 1x16 blocks (activations and
/// gradients), 16x16 blocks only without it (weights).
pub fn check_nvfp4(x: &HostMatrix, config: &Nvfp4Config) -> Result<()> {
    x.require_blocks(NVFP4_BLOCK, NVFP4_BLOCK, "NVFP4")?;
    if config.block_2d && config.rht {
        return Err(LowpError::invalid(
            format!("NVFP4 options for tensor `{}`", x.name),
            "16x16 blocks with RHT",
            "RHT applies to 1x16 activations and gradients; 16x16 blocks are for weights",
        ));
    }
    Ok(())
}

pub fn quantize_nvfp4(x: &HostMatrix, config: &Nvfp4Config, usage: Usage) -> Result<HostQuantized> {
    check_nvfp4(x, config)?;
    let tile_rows = if config.block_2d { NVFP4_BLOCK } else { 1 };
    let rowwise_amax = amax(&x.values);
    let rowwise = usage.rowwise.then(|| {
        let key = config
            .stochastic_seed
            .map(|s| stream_key(s, ROWWISE_STREAM));
        quantize_rows(&x.values, x.rows, x.cols, tile_rows, rowwise_amax, key)
    });
    let columnwise = usage.columnwise.then(|| {
        let mut source = transpose(&x.values, x.rows, x.cols);
        if config.rht {
            rht_rows(&mut source, x.rows, x.dtype);
        }
        let col_amax = if config.rht {
            amax(&source)
        } else {
            rowwise_amax
        };
        let key = config
            .stochastic_seed
            .map(|s| stream_key(s, COLUMNWISE_STREAM));
        quantize_rows(&source, x.cols, x.rows, tile_rows, col_amax, key)
    });
    Ok(HostQuantized {
        format: config.format(),
        rows: x.rows,
        cols: x.cols,
        rowwise,
        columnwise,
    })
}

/// Quantizes a row-major `[rows, cols]` matrix with blocks of `tile_rows x 16` along its rows.
fn quantize_rows(
    values: &[f32],
    rows: usize,
    cols: usize,
    tile_rows: usize,
    global_amax: f32,
    sr_key: Option<u32>,
) -> QuantizedData {
    let s_enc = global_encode_scale(global_amax);
    let s_dec = 1.0 / s_enc;
    let blocks_per_row = cols / NVFP4_BLOCK;
    // Block amaxes over `tile_rows x 16`, one per (tile row, block column).
    let mut block_amax = vec![0.0f32; (rows / tile_rows) * blocks_per_row];
    for r in 0..rows {
        for c in 0..cols {
            let b = (r / tile_rows) * blocks_per_row + c / NVFP4_BLOCK;
            block_amax[b] = fmaxf(block_amax[b], values[r * cols + c].abs());
        }
    }
    let scale_shape = [round_up(rows, 128), round_up(blocks_per_row, 4)];
    let mut scales = vec![0u8; scale_shape[0] * scale_shape[1]];
    let mut codes = vec![0u8; rows * cols / 2];
    for r in 0..rows {
        for b in 0..blocks_per_row {
            let byte = block_scale(block_amax[(r / tile_rows) * blocks_per_row + b], s_enc);
            scales[r * scale_shape[1] + b] = byte;
            let enc = element_encode_scale(byte, s_dec);
            for i in 0..NVFP4_BLOCK {
                let index = r * cols + b * NVFP4_BLOCK + i;
                let v = values[index] * enc;
                let code = match sr_key {
                    Some(key) => stochastic_round_e2m1(v, random_byte(key, index as u32)),
                    None => encode_e2m1(v.clamp(-6.0, 6.0)),
                };
                codes[index / 2] |= code << (4 * (index % 2));
            }
        }
    }
    QuantizedData {
        codes,
        codes_shape: [rows, cols / 2],
        scales: Scales::BlockBytes {
            shape: scale_shape,
            bytes: scales,
            layout: ScaleLayout::Compact,
        },
        amax: Some(global_amax),
    }
}

/// Dequantizes one representation (compact scales) to the logical `[M, K]` layout: columnwise data
/// is transposed back and, with RHT, transformed back.
pub(crate) fn dequantize_codes(rowwise: bool, rht: bool, data: &QuantizedData) -> Result<Vec<f32>> {
    let (shape, bytes) = match &data.scales {
        Scales::BlockBytes {
            shape,
            bytes,
            layout: ScaleLayout::Compact,
        } => (shape, bytes),
        _ => {
            return Err(LowpError::invalid(
                "NVFP4 scales",
                "not compact E4M3 bytes",
                "dequantize reads compact scales: unswizzle them first",
            ))
        }
    };
    let [rows, half_cols] = data.codes_shape;
    let cols = half_cols * 2;
    let expected = [round_up(rows, 128), round_up(cols / NVFP4_BLOCK, 4)];
    if *shape != expected || bytes.len() != shape[0] * shape[1] || cols % NVFP4_BLOCK != 0 {
        return Err(LowpError::invalid(
            "NVFP4 scale shape",
            format!("{shape:?}"),
            format!("codes [{rows}, {half_cols}] need {expected:?}"),
        ));
    }
    let Some(amax) = data.amax else {
        return Err(LowpError::invalid(
            "NVFP4 amax",
            "none",
            "NVFP4 data carries its global amax",
        ));
    };
    let s_dec = 1.0 / global_encode_scale(amax);
    // E2M1 values first; with RHT the inverse transform runs on them (exact: small dyadic
    // numbers), and each block's scale is applied last, one rounding per element. A block and an
    // RHT chunk are the same 16 elements, so they share the scale.
    let mut out: Vec<f32> = (0..rows * cols)
        .map(|i| {
            let byte = data.codes[i / 2];
            decode_e2m1(if i % 2 == 0 { byte & 0xF } else { byte >> 4 })
        })
        .collect();
    if !rowwise && rht {
        debug_assert_eq!(NVFP4_BLOCK, RHT_SIZE);
        inverse_rht_rows(&mut out);
    }
    for r in 0..rows {
        for c in 0..cols {
            let s_b = Fp8Format::E4M3.decode(bytes[r * shape[1] + c / NVFP4_BLOCK]);
            out[r * cols + c] *= s_b * s_dec;
        }
    }
    if !rowwise {
        out = transpose(&out, rows, cols);
    }
    Ok(out)
}
