//! NVFP4: E2M1 codes with E4M3 scales per 1x16 block (or 16x16 tile) under an f32 global scale,
//! rowwise `[M, K/2]` and transposed columnwise `[K, M/2]` from one read, optional random Hadamard
//! transform on the columnwise copy and stochastic rounding. The global amaxes come from the amax
//! pass (`amax.rs`). Host reference: `burn_lowp::format::nvfp4`.
//!
//! Tiling: a cube of 64 units covers 64 rows x 128 columns; each unit owns 16 rows x 8 columns,
//! i.e. one columnwise block (and its RHT) for each of its 8 columns and half a rowwise block for
//! each row (the other half belongs to the neighbouring unit, paired through shared memory).

use crate::codec::{abs_bits_for_amax, encode_e2m1, load_chunk, ElemKind};
use crate::flags::{COLUMNWISE, ROWWISE, STOCHASTIC, SWIZZLED};
use crate::hadamard::rht16;
use crate::random::random_byte;
use crate::scale::{nvfp4_block_scale, nvfp4_element_scale, nvfp4_global_encode_scale};
use crate::swizzle::scale_index;
use cubecl::prelude::*;

pub const NV_ROWS_PER_UNIT: usize = 16;
pub const NV_ROW_GROUPS: usize = 4;
pub const NV_STRIPS: usize = 16;
pub const NV_UNITS: usize = NV_ROW_GROUPS * NV_STRIPS;
pub const NV_TILE_ROWS: usize = NV_ROWS_PER_UNIT * NV_ROW_GROUPS;
pub const NV_TILE_COLS: usize = 8 * NV_STRIPS;

#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub struct Nvfp4KernelConfig {
    pub kind: ElemKind,
    pub block_2d: bool,
    pub rht: bool,
    /// Fully unroll the per-row / per-column loops (fast code; slow to compile on lavapipe).
    pub unroll: bool,
}

/// The E2M1 code of `v`, rounded to nearest even or stochastically with 8 random bits.
#[cube]
pub fn round_e2m1(v: f32, random: u32, stochastic: bool) -> u32 {
    let mut code = encode_e2m1(v);
    if stochastic {
        code = stochastic_round_e2m1(v, random);
    }
    code
}

/// TE's software stochastic rounding to the E2M1 grid (see the host reference).
#[cube]
pub fn stochastic_round_e2m1(x: f32, random: u32) -> u32 {
    let a = f32::reinterpret(u32::reinterpret(x) & 0x7FFF_FFFFu32);
    let u = f32::cast_from(random) * 0.00390625f32; // r / 256
    let step = select(a >= 4.0f32, 2.0f32, select(a >= 2.0f32, 1.0f32, 0.5f32));
    let t = a + u * step;
    let step_t = select(t >= 4.0f32, 2.0f32, select(t >= 2.0f32, 1.0f32, 0.5f32));
    let inverse_step_t = select(t >= 4.0f32, 0.5f32, select(t >= 2.0f32, 1.0f32, 2.0f32));
    let q = ((t * inverse_step_t).floor() * step_t).min(6.0f32);
    let mut code = 0u32;
    if !x.is_nan() {
        code = encode_e2m1(select(x < 0.0f32, -q, q));
    }
    code
}

#[cube(launch_unchecked)]
pub fn nvfp4_kernel<N: Size>(
    input: &Array<Vector<u32, N>>,
    rowwise_amax: &Array<u32>,
    columnwise_amax: &Array<u32>,
    rowwise: &mut Array<u32>,
    rowwise_scales: &mut Array<u8>,
    columnwise: &mut Array<u32>,
    columnwise_scales: &mut Array<u8>,
    rows: usize,
    cols: usize,
    rowwise_key: u32,
    columnwise_key: u32,
    flags: u32,
    #[comptime] config: Nvfp4KernelConfig,
) {
    let stochastic = (flags & STOCHASTIC) != 0u32;
    let swizzled = (flags & SWIZZLED) != 0u32;
    let unit = UNIT_POS as usize;
    let group = unit % NV_ROW_GROUPS;
    let strip = unit / NV_ROW_GROUPS;
    let local_row0 = group * NV_ROWS_PER_UNIT;
    let row0 = CUBE_POS_Y as usize * NV_TILE_ROWS + local_row0;
    let col0 = CUBE_POS_X as usize * NV_TILE_COLS + strip * 8;
    let active = row0 < rows && col0 < cols;

    let mut values = Array::<f32>::new(128usize);
    if active {
        #[unroll(config.unroll)]
        for i in 0..16usize {
            load_chunk::<N>(
                input,
                (row0 + i) * cols + col0,
                &mut values,
                i * 8,
                config.kind,
            );
        }
    } else {
        #[unroll]
        for i in 0..128usize {
            values[i] = 0.0f32;
        }
    }

    // Row maxima over this unit's 8 columns, paired with the neighbouring strip's through shared
    // memory into 16-column block maxima.
    let mut row_partial = SharedMemory::<u32>::new(NV_TILE_ROWS * NV_STRIPS);
    let mut row_amax = Array::<u32>::new(16usize);
    #[unroll(config.unroll)]
    for i in 0..16usize {
        let mut m = 0u32;
        #[unroll]
        for j in 0..8usize {
            let a = abs_bits_for_amax(values[i * 8 + j]);
            m = select(a > m, a, m);
        }
        row_partial[(local_row0 + i) * NV_STRIPS + strip] = m;
    }
    sync_cube();
    let pair = strip - strip % 2;
    let mut tile_amax = 0u32;
    #[unroll(config.unroll)]
    for i in 0..16usize {
        let a = row_partial[(local_row0 + i) * NV_STRIPS + pair];
        let b = row_partial[(local_row0 + i) * NV_STRIPS + pair + 1];
        let m = select(a > b, a, b);
        row_amax[i] = m;
        tile_amax = select(m > tile_amax, m, tile_amax);
    }

    if active {
        let row_scale_cols = (cols / 16 + 3) / 4 * 4;
        let col_scale_cols = (rows / 16 + 3) / 4 * 4;
        if (flags & ROWWISE) != 0u32 {
            let s_enc = nvfp4_global_encode_scale(f32::reinterpret(rowwise_amax[0]));
            let s_dec = 1.0f32 / s_enc;
            let multiplier = s_enc * f32::reinterpret(0x3E2A_AAABu32); // * (1/6)
            #[unroll(config.unroll)]
            for i in 0..16usize {
                let row = row0 + i;
                let block_amax = if comptime![config.block_2d] {
                    tile_amax
                } else {
                    row_amax[i]
                };
                let byte = nvfp4_block_scale(f32::reinterpret(block_amax), multiplier);
                if strip % 2 == 0 {
                    rowwise_scales[scale_index(row, col0 / 16, row_scale_cols, swizzled)] =
                        u8::cast_from(byte);
                }
                let enc = nvfp4_element_scale(byte, s_dec);
                let mut word = 0u32;
                #[unroll]
                for j in 0..8usize {
                    let index = row * cols + col0 + j;
                    let mut random = 0u32;
                    if stochastic {
                        random = random_byte(rowwise_key, u32::cast_from(index));
                    }
                    word |= round_e2m1(values[i * 8 + j] * enc, random, stochastic)
                        << comptime![4 * j as u32];
                }
                rowwise[(row * cols + col0) / 8] = word;
            }
        }
        if (flags & COLUMNWISE) != 0u32 {
            if comptime![config.rht] {
                #[unroll(config.unroll)]
                for j in 0..8usize {
                    rht16(&mut values, j, 8usize, config.kind);
                }
            }
            let s_enc = nvfp4_global_encode_scale(f32::reinterpret(columnwise_amax[0]));
            let s_dec = 1.0f32 / s_enc;
            let multiplier = s_enc * f32::reinterpret(0x3E2A_AAABu32);
            #[unroll(config.unroll)]
            for j in 0..8usize {
                let col = col0 + j;
                let mut block_amax = tile_amax;
                if comptime![!config.block_2d] {
                    block_amax = 0u32;
                    #[unroll(config.unroll)]
                    for i in 0..16usize {
                        let a = abs_bits_for_amax(values[i * 8 + j]);
                        block_amax = select(a > block_amax, a, block_amax);
                    }
                }
                let byte = nvfp4_block_scale(f32::reinterpret(block_amax), multiplier);
                columnwise_scales[scale_index(col, row0 / 16, col_scale_cols, swizzled)] =
                    u8::cast_from(byte);
                let enc = nvfp4_element_scale(byte, s_dec);
                #[unroll]
                for half in 0..2usize {
                    let mut word = 0u32;
                    #[unroll]
                    for k in 0..8usize {
                        let i = comptime![half * 8 + k];
                        let index = col * rows + row0 + i;
                        let mut random = 0u32;
                        if stochastic {
                            random = random_byte(columnwise_key, u32::cast_from(index));
                        }
                        word |= round_e2m1(values[i * 8 + j] * enc, random, stochastic)
                            << comptime![4 * k as u32];
                    }
                    columnwise[(col * rows + row0) / 8 + half] = word;
                }
            }
        }
    }
}
