//! `mxfp8_kernel`, the MXFP8 kernel for every case (the launcher takes it for f32 inputs): a
//! cube of 128 units covers one 32-row block x 128 columns; each unit owns 4 rows x 8 columns.
//! Block amaxes go through shared memory in two steps (per-unit partials, then one unit per
//! block).

use cubecl::prelude::*;

use crate::cast::codec::{e8m0_reciprocal, encode_fp8_by, float_to_e8m0};
use crate::cast::flags::{COLUMNWISE, ROWWISE, SWIZZLED};
use crate::cast::mxfp8::{pack4, padded_row_scale_cols, MX_TILE_ROWS, Mxfp8Config};
use crate::cast::output::CastOutputs;
use crate::cast::swizzle::{scale_index, swizzled_offset};
use crate::util::elements::{abs_bits_for_amax, load_chunk};

pub const MX_ROWS_PER_UNIT: usize = 4;
pub const MX_ROW_GROUPS: usize = 8;
pub const MX_STRIPS: usize = 16;
pub const MX_UNITS: usize = MX_ROW_GROUPS * MX_STRIPS;
pub const MX_TILE_COLS: usize = 8 * MX_STRIPS;
/// Blocks of 32 columns per tile.
const MX_TILE_KBLOCKS: usize = MX_TILE_COLS / 32;

#[cube(launch_unchecked)]
pub fn mxfp8_kernel<N: Size>(
    input: &Array<Vector<u32, N>>,
    outputs: &mut CastOutputs<u32, u8>,
    rows: usize,
    cols: usize,
    flags: u32,
    #[comptime] config: Mxfp8Config,
) {
    let rowwise_on = (flags & ROWWISE) != 0u32;
    let columnwise_on = (flags & COLUMNWISE) != 0u32;
    let swizzled = (flags & SWIZZLED) != 0u32;
    let unit = UNIT_POS as usize;
    let group = unit % MX_ROW_GROUPS;
    let strip = unit / MX_ROW_GROUPS;
    let tile_row = CUBE_POS_Y as usize;
    let tile_col0 = CUBE_POS_X as usize * MX_TILE_COLS;
    let local_row0 = group * MX_ROWS_PER_UNIT;
    let row0 = tile_row * MX_TILE_ROWS + local_row0;
    let col0 = tile_col0 + strip * 8;
    let active = col0 < cols;
    let reciprocal_max = f32::new(comptime![f32::from_bits(config.reciprocal_max_bits)]);
    let row_scale_cols = padded_row_scale_cols(cols);
    let col_scale_cols = (cols + 127) / 128 * 128;
    let col_scale_rows = (rows / 32 + 3) / 4 * 4;

    // 1. Load 4 x 8 values and publish per-unit partial maxima.
    let mut values = Array::<f32>::new(32usize);
    let mut row_partial = SharedMemory::<u32>::new(MX_TILE_ROWS * MX_STRIPS);
    let mut col_partial = SharedMemory::<u32>::new(MX_ROW_GROUPS * MX_TILE_COLS);
    let mut col_max = Array::<u32>::new(8usize);
    #[unroll]
    for j in 0..8usize {
        col_max[j] = 0u32;
    }
    if active {
        #[unroll]
        for i in 0..4usize {
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
        for i in 0..32usize {
            values[i] = 0.0f32;
        }
    }
    // Partials are laid out [strip][row] and [group][column] so that the reducing units below read
    // consecutive words (no shared-memory bank conflicts).
    #[unroll]
    for i in 0..4usize {
        let mut m = 0u32;
        #[unroll]
        for j in 0..8usize {
            let a = abs_bits_for_amax(values[i * 8 + j]);
            m = select(a > m, a, m);
            col_max[j] = max(a, col_max[j]);
        }
        row_partial[strip * MX_TILE_ROWS + local_row0 + i] = m;
    }
    if columnwise_on || comptime![config.block_2d] {
        #[unroll]
        for j in 0..8usize {
            col_partial[group * MX_TILE_COLS + strip * 8 + j] = col_max[j];
        }
    }
    sync_cube();

    // 2. One unit per (row, 32-column block) and one per column reduce the partials.
    let mut row_block = SharedMemory::<u32>::new(MX_TILE_ROWS * MX_TILE_KBLOCKS);
    let mut col_block = SharedMemory::<u32>::new(MX_TILE_COLS);
    // Unit u reduces row u % 32 of 32-column block u / 32 (row_block is [kblock][row]) and column u.
    {
        let r = unit % MX_TILE_ROWS;
        let kb = unit / MX_TILE_ROWS;
        let mut m = 0u32;
        #[unroll]
        for s in 0..4usize {
            let p = row_partial[(kb * 4 + s) * MX_TILE_ROWS + r];
            m = select(p > m, p, m);
        }
        row_block[unit] = m;
        if columnwise_on || comptime![config.block_2d] {
            let mut c = 0u32;
            #[unroll]
            for g in 0..8usize {
                let p = col_partial[g * MX_TILE_COLS + unit];
                c = select(p > c, p, c);
            }
            col_block[unit] = c;
        }
    }
    sync_cube();

    // 2D: one amax per 32x32 tile, from the column maxima.
    let mut tile_block = SharedMemory::<u32>::new(MX_TILE_KBLOCKS);
    if comptime![config.block_2d] {
        if unit < MX_TILE_KBLOCKS {
            let mut m = 0u32;
            #[unroll]
            for c in 0..32usize {
                let p = col_block[unit * 32 + c];
                m = select(p > m, p, m);
            }
            tile_block[unit] = m;
        }
        sync_cube();
    }

    // 3. Scales: the reducing unit of each block writes its byte.
    {
        let r = unit % MX_TILE_ROWS;
        let kb = unit / MX_TILE_ROWS;
        let global_kb = tile_col0 / 32 + kb;
        if rowwise_on && global_kb < cols / 32 {
            let amax = if comptime![config.block_2d] {
                tile_block[kb]
            } else {
                row_block[unit]
            };
            let e = float_to_e8m0(f32::reinterpret(amax) * reciprocal_max);
            let row = tile_row * MX_TILE_ROWS + r;
            outputs.rowwise_scales[scale_index(row, global_kb, row_scale_cols, swizzled)] =
                u8::cast_from(e);
        }
        let c = tile_col0 + unit;
        if columnwise_on && c < cols {
            let amax = if comptime![config.block_2d] {
                tile_block[unit / 32]
            } else {
                col_block[unit]
            };
            let e = float_to_e8m0(f32::reinterpret(amax) * reciprocal_max);
            let index = select(
                swizzled,
                swizzled_offset(c, tile_row, col_scale_rows),
                tile_row * col_scale_cols + c,
            );
            outputs.columnwise_scales[index] = u8::cast_from(e);
        }
    }

    // 4. Codes.
    if active {
        let kb = strip / 4;
        let mut codes = Array::<u32>::new(32usize);
        if rowwise_on {
            #[unroll(config.unroll)]
            for i in 0..4usize {
                let amax = if comptime![config.block_2d] {
                    tile_block[kb]
                } else {
                    row_block[kb * MX_TILE_ROWS + local_row0 + i]
                };
                let multiplier =
                    e8m0_reciprocal(float_to_e8m0(f32::reinterpret(amax) * reciprocal_max));
                #[unroll]
                for j in 0..8usize {
                    codes[i * 8 + j] = encode_fp8_by(values[i * 8 + j] * multiplier, config.fp8, config.encoder);
                }
                let word = ((row0 + i) * cols + col0) / 4;
                outputs.rowwise[word] = pack4(&codes, i * 8);
                outputs.rowwise[word + 1] = pack4(&codes, i * 8 + 4);
            }
        }
        if columnwise_on {
            #[unroll(config.unroll)]
            for j in 0..8usize {
                let amax = if comptime![config.block_2d] {
                    tile_block[kb]
                } else {
                    col_block[strip * 8 + j]
                };
                let multiplier =
                    e8m0_reciprocal(float_to_e8m0(f32::reinterpret(amax) * reciprocal_max));
                #[unroll]
                for i in 0..4usize {
                    codes[i * 8 + j] = encode_fp8_by(values[i * 8 + j] * multiplier, config.fp8, config.encoder);
                }
            }
            #[unroll(config.unroll)]
            for i in 0..4usize {
                let word = ((row0 + i) * cols + col0) / 4;
                outputs.columnwise[word] = pack4(&codes, i * 8);
                outputs.columnwise[word + 1] = pack4(&codes, i * 8 + 4);
            }
        }
    }
}
