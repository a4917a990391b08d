//! `fp8_block_kernel`, FP8 block scaling for every case (the launcher takes it for the rowwise
//! copy alone and for f32 inputs): one cube per 128x128 tile, 512 units of 4 rows x 8 columns.

use cubecl::prelude::*;

use crate::cast::codec::encode_fp8_by;
use crate::cast::flags::{COLUMNWISE, ROWWISE};
use crate::cast::fp8_block::{columnwise_scale_index, tile_group, BLOCK_TILE, Fp8BlockKernelConfig};
use crate::cast::output::CastOutputs;
use crate::cast::scale::scale_from_amax;
use crate::util::elements::{abs_bits_for_amax, load_chunk};

pub const BLOCK_ROWS_PER_UNIT: usize = 4;
pub const BLOCK_ROW_GROUPS: usize = 32;
pub const BLOCK_STRIPS: usize = 16;
pub const BLOCK_UNITS: usize = BLOCK_ROW_GROUPS * BLOCK_STRIPS;

#[cube(launch_unchecked)]
pub fn fp8_block_kernel<N: Size>(
    input: &Array<Vector<u32, N>>,
    outputs: &mut CastOutputs<u32, u32>,
    group_start: &Array<u32>,
    group_rows: &Array<u32>,
    rows: usize,
    cols: usize,
    groups: usize,
    flags: u32,
    #[comptime] config: Fp8BlockKernelConfig,
) {
    let rowwise_on = (flags & ROWWISE) != 0u32;
    let (g_start, g_rows) =
        tile_group(group_start, group_rows, groups, rows, CUBE_POS_Y as usize, config.grouped);
    // A tile past the last group (the zero tail) has no columnwise place.
    let columnwise_on = (flags & COLUMNWISE) != 0u32
        && CUBE_POS_Y as usize * BLOCK_TILE - g_start < g_rows;
    let unit = UNIT_POS as usize;
    // Row groups vary fastest within a warp when the transposed columnwise copy is written (its
    // stores along M then coalesce); strips vary fastest for rowwise only (stores along K do).
    let group = select(columnwise_on, unit % BLOCK_ROW_GROUPS, unit / BLOCK_STRIPS);
    let strip = select(columnwise_on, unit / BLOCK_ROW_GROUPS, unit % BLOCK_STRIPS);
    let tile_row = CUBE_POS_Y as usize;
    let tile_col = CUBE_POS_X as usize;
    let local_row0 = group * BLOCK_ROWS_PER_UNIT;
    let row0 = tile_row * BLOCK_TILE + local_row0;
    let col0 = tile_col * BLOCK_TILE + strip * 8;
    let fp8 = comptime![config.rule.fp8];

    let mut values = Array::<f32>::new(32usize);
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
    let mut row_partial = SharedMemory::<u32>::new(BLOCK_TILE * BLOCK_STRIPS);
    let mut col_partial = SharedMemory::<u32>::new(BLOCK_ROW_GROUPS * BLOCK_TILE);
    let mut col_max = Array::<u32>::new(8usize);
    #[unroll]
    for j in 0..8usize {
        col_max[j] = 0u32;
    }
    #[unroll]
    for i in 0..4usize {
        let mut m = 0u32;
        #[unroll]
        for j in 0..8usize {
            let a = abs_bits_for_amax(values[i * 8 + j]);
            m = select(a > m, a, m);
            col_max[j] = select(a > col_max[j], a, col_max[j]);
        }
        // [strip][row]: the row reducers below read consecutive words.
        row_partial[strip * BLOCK_TILE + local_row0 + i] = m;
    }
    #[unroll]
    for j in 0..8usize {
        col_partial[group * BLOCK_TILE + strip * 8 + j] = col_max[j];
    }
    sync_cube();

    let mut row_amax = SharedMemory::<u32>::new(BLOCK_TILE);
    let mut col_amax = SharedMemory::<u32>::new(BLOCK_TILE);
    if unit < BLOCK_TILE {
        let mut m = 0u32;
        #[unroll]
        for s in 0..BLOCK_STRIPS {
            let p = row_partial[s * BLOCK_TILE + unit];
            m = select(p > m, p, m);
        }
        row_amax[unit] = m;
    } else if unit < 2 * BLOCK_TILE {
        let c = unit - BLOCK_TILE;
        let mut m = 0u32;
        #[unroll]
        for g in 0..BLOCK_ROW_GROUPS {
            let p = col_partial[g * BLOCK_TILE + c];
            m = select(p > m, p, m);
        }
        col_amax[c] = m;
    }
    sync_cube();

    let mut tile_amax = SharedMemory::<u32>::new(17usize);
    if comptime![config.block_2d] {
        // Two steps: 16 units fold 8 row maxima each, then one unit folds the 16.
        if unit < 16 {
            let mut m = 0u32;
            #[unroll]
            for k in 0..8usize {
                let p = row_amax[unit * 8 + k];
                m = select(p > m, p, m);
            }
            tile_amax[1 + unit] = m;
        }
        sync_cube();
        if unit == 0 {
            let mut m = 0u32;
            #[unroll]
            for k in 0..16usize {
                let p = tile_amax[1 + k];
                m = select(p > m, p, m);
            }
            tile_amax[0] = m;
        }
        sync_cube();
    }

    // Scales (scale_inv), written by the unit that owns each block.
    let k_blocks = cols / BLOCK_TILE;
    if comptime![config.block_2d] {
        if unit == 0 {
            let scale_inv = 1.0f32 / scale_from_amax(f32::reinterpret(tile_amax[0]), config.rule);
            if rowwise_on {
                outputs.rowwise_scales[tile_row * k_blocks + tile_col] = u32::reinterpret(scale_inv);
            }
            if columnwise_on {
                outputs.columnwise_scales[columnwise_scale_index(
                    tile_col,
                    tile_row,
                    g_start,
                    g_rows,
                    cols,
                    true,
                )] = u32::reinterpret(scale_inv);
            }
        }
    } else if unit < BLOCK_TILE {
        if rowwise_on {
            let scale_inv = 1.0f32 / scale_from_amax(f32::reinterpret(row_amax[unit]), config.rule);
            outputs.rowwise_scales[(tile_row * BLOCK_TILE + unit) * k_blocks + tile_col] =
                u32::reinterpret(scale_inv);
        }
    } else if unit < 2 * BLOCK_TILE {
        if columnwise_on {
            let c = unit - BLOCK_TILE;
            let scale_inv = 1.0f32 / scale_from_amax(f32::reinterpret(col_amax[c]), config.rule);
            outputs.columnwise_scales[columnwise_scale_index(
                tile_col * BLOCK_TILE + c,
                tile_row,
                g_start,
                g_rows,
                cols,
                false,
            )] = u32::reinterpret(scale_inv);
        }
    }

    let mut codes = Array::<u32>::new(32usize);
    if rowwise_on {
        #[unroll(config.unroll)]
        for i in 0..4usize {
            let amax = if comptime![config.block_2d] {
                tile_amax[0]
            } else {
                row_amax[local_row0 + i]
            };
            let scale = scale_from_amax(f32::reinterpret(amax), config.rule);
            #[unroll]
            for j in 0..8usize {
                codes[i * 8 + j] = encode_fp8_by(values[i * 8 + j] * scale, fp8, config.encoder);
            }
            let low = codes[i * 8]
                | (codes[i * 8 + 1] << 8u32)
                | (codes[i * 8 + 2] << 16u32)
                | (codes[i * 8 + 3] << 24u32);
            let high = codes[i * 8 + 4]
                | (codes[i * 8 + 5] << 8u32)
                | (codes[i * 8 + 6] << 16u32)
                | (codes[i * 8 + 7] << 24u32);
            if columnwise_on {
                // Row groups vary fastest in this mapping, so stage the row's words in the (now
                // unused) partials and store them coalesced below.
                let staged = (local_row0 + i) * (BLOCK_TILE / 4) + strip * 2;
                col_partial[staged] = low;
                col_partial[staged + 1] = high;
            } else {
                let word = ((row0 + i) * cols + col0) / 4;
                outputs.rowwise[word] = low;
                outputs.rowwise[word + 1] = high;
            }
        }
    }
    if rowwise_on && columnwise_on {
        sync_cube();
        // 128 rows x 32 words: consecutive units store consecutive words of a row.
        #[unroll]
        for k in 0..8usize {
            let index = unit + k * BLOCK_UNITS;
            let r = index / (BLOCK_TILE / 4);
            let w = index % (BLOCK_TILE / 4);
            outputs.rowwise[((tile_row * BLOCK_TILE + r) * cols + tile_col * BLOCK_TILE) / 4 + w] =
                col_partial[index];
        }
    }
    if columnwise_on {
        #[unroll(config.unroll)]
        for j in 0..8usize {
            let amax = if comptime![config.block_2d] {
                tile_amax[0]
            } else {
                col_amax[strip * 8 + j]
            };
            let scale = scale_from_amax(f32::reinterpret(amax), config.rule);
            #[unroll]
            for i in 0..4usize {
                codes[i * 8 + j] = encode_fp8_by(values[i * 8 + j] * scale, fp8, config.encoder);
            }
            let word = (g_start * cols + (col0 + j) * g_rows + (row0 - g_start)) / 4;
            outputs.columnwise[word] = codes[j]
                | (codes[8 + j] << 8u32)
                | (codes[16 + j] << 16u32)
                | (codes[24 + j] << 24u32);
        }
    }
}
