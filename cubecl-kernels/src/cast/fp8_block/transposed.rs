//! `fp8_block_transposed_kernel`, FP8 block scaling of 16-bit inputs with the transposed
//! columnwise copy: one cube per 128x128 tile, 128 units of 16 rows x 8 columns, shaped for
//! 16-byte transposed stores.

use cubecl::prelude::*;

use crate::cast::codec::encode_fp8_by;
use crate::cast::flags::ROWWISE;
use crate::cast::fp8_block::{columnwise_scale_index, tile_group, BLOCK_TILE, Fp8BlockKernelConfig};
use crate::cast::output::CastOutputs;
use crate::cast::scale::scale_from_amax;
use crate::util::elements::{abs_bits_for_amax, half_of_word};

/// Units of `fp8_block_transposed_kernel`: 16 along K (8 columns each) by 8 along M (16 rows each)
/// cover one 128x128 tile.
pub const TRANSPOSED_UNITS: usize = 128;
const TRANSPOSED_COL_UNITS: usize = 16;
const TRANSPOSED_UNIT_ROWS: usize = 16;
/// Row partials are `[column unit][row]` with one padding word per column unit, so that the 32
/// units of a warp (16 column units, two row units 16 rows apart) write 32 distinct banks.
const ROW_PARTIAL_STRIDE: usize = BLOCK_TILE + 1;

/// FP8 block scaling (1x128 or 128x128) with the transposed columnwise copy (and the rowwise copy
/// when asked), for 16-bit inputs. Same codes and scales as `fp8_block_kernel`, with a unit shape chosen for the
/// transposed stores: a unit holds 16 rows x 8 columns, loaded as one 16-byte vector per row (16
/// units of a warp read 256 contiguous bytes of a row), and stores each of its columns' 16 codes as
/// one 16-byte vector, next to the 16 codes of the warp's other row unit (full 32-byte sectors).
/// `fp8_block_kernel` holds 4 rows x 8 columns per unit and reads 16 bytes from each of 32 rows
/// per warp load: half sectors, which held its columnwise pass at half of the DRAM bandwidth
/// (Nsight Compute, `benches/results/quantize-instruction-h100/`).
///
/// The input is kept as raw words (64 per unit) and decoded where it is used, which keeps the
/// unit at about the registers of the 4x8 kernel.
#[cube(launch_unchecked)]
pub fn fp8_block_transposed_kernel<N: Size>(
    input: &Array<Vector<u32, N>>,
    outputs: &mut CastOutputs<Vector<u32, N>, u32>,
    group_start: &Array<u32>,
    group_rows: &Array<u32>,
    rows: usize,
    cols: usize,
    groups: usize,
    flags: u32,
    #[comptime] config: Fp8BlockKernelConfig,
) {
    let rowwise_on = (flags & ROWWISE) != 0u32;
    let tile_row = CUBE_POS_Y as usize;
    let tile_col = CUBE_POS_X as usize;
    let (g_start, g_rows) =
        tile_group(group_start, group_rows, groups, rows, tile_row, config.grouped);
    // A tile past the last group (the zero tail) has no columnwise place.
    let columnwise_on = tile_row * BLOCK_TILE - g_start < g_rows;
    let unit = UNIT_POS as usize;
    let col_unit = unit % TRANSPOSED_COL_UNITS;
    let row_unit = unit / TRANSPOSED_COL_UNITS;
    let row0 = tile_row * BLOCK_TILE + row_unit * TRANSPOSED_UNIT_ROWS;
    let col0 = tile_col * BLOCK_TILE + col_unit * 8;
    let fp8 = comptime![config.rule.fp8];
    let kind = comptime![config.kind];

    // 1. Load 16 rows x 8 columns (4 words a row) and publish row and column partial maxima.
    let mut words = Array::<u32>::new(64usize);
    #[unroll(config.unroll)]
    for r in 0..16usize {
        let v = input[((row0 + r) * cols + col0) / 8];
        #[unroll]
        for w in 0..4usize {
            words[r * 4 + w] = v[w];
        }
    }
    let block_2d = comptime![config.block_2d];
    let mut row_partial = SharedMemory::<u32>::new(comptime![if config.block_2d {
        1
    } else {
        TRANSPOSED_COL_UNITS * ROW_PARTIAL_STRIDE
    }]);
    let mut col_partial =
        SharedMemory::<u32>::new(comptime![if config.block_2d { 1 } else { 8 * BLOCK_TILE }]);
    let mut col_max = Array::<u32>::new(8usize);
    #[unroll]
    for j in 0..8usize {
        col_max[j] = 0u32;
    }
    #[unroll(config.unroll)]
    for r in 0..16usize {
        let mut m = 0u32;
        #[unroll]
        for j in 0..8usize {
            let a = abs_bits_for_amax(half_of_word(words[r * 4 + j / 2], j % 2 == 1, kind));
            m = max(m, a);
            col_max[j] = max(col_max[j], a);
        }
        if comptime![!block_2d] {
            row_partial[col_unit * ROW_PARTIAL_STRIDE + row_unit * TRANSPOSED_UNIT_ROWS + r] = m;
        }
    }

    // 2. The scales the codes are multiplied by, shared per row and per column of the tile.
    //    1D: unit u reduces row u and column u, writes their scale_inv. 2D: one amax for the
    //    tile (unit maxima, 16 folds of 8, then every unit folds the 16); unit 0 writes it.
    let mut row_scale = SharedMemory::<f32>::new(BLOCK_TILE);
    let mut col_scale = SharedMemory::<f32>::new(BLOCK_TILE);
    if comptime![block_2d] {
        let mut unit_amax = SharedMemory::<u32>::new(TRANSPOSED_UNITS);
        let mut fold = SharedMemory::<u32>::new(16usize);
        let mut m = 0u32;
        #[unroll]
        for j in 0..8usize {
            m = max(m, col_max[j]);
        }
        unit_amax[unit] = m;
        sync_cube();
        if unit < 16 {
            let mut f = 0u32;
            #[unroll]
            for k in 0..8usize {
                f = max(f, unit_amax[unit * 8 + k]);
            }
            fold[unit] = f;
        }
        sync_cube();
        let mut t = 0u32;
        #[unroll]
        for k in 0..16usize {
            t = max(t, fold[k]);
        }
        let scale = scale_from_amax(f32::reinterpret(t), config.rule);
        row_scale[unit] = scale;
        col_scale[unit] = scale;
        if unit == 0 {
            let scale_inv = u32::reinterpret(1.0f32 / scale);
            if rowwise_on {
                outputs.rowwise_scales[tile_row * (cols / BLOCK_TILE) + tile_col] = scale_inv;
            }
            if columnwise_on {
                outputs.columnwise_scales[columnwise_scale_index(
                    tile_col,
                    tile_row,
                    g_start,
                    g_rows,
                    cols,
                    true,
                )] = scale_inv;
            }
        }
    } else {
        #[unroll]
        for j in 0..8usize {
            col_partial[row_unit * BLOCK_TILE + col_unit * 8 + j] = col_max[j];
        }
        sync_cube();
        let mut m = 0u32;
        #[unroll]
        for k in 0..16usize {
            m = max(m, row_partial[k * ROW_PARTIAL_STRIDE + unit]);
        }
        let scale = scale_from_amax(f32::reinterpret(m), config.rule);
        row_scale[unit] = scale;
        if rowwise_on {
            outputs.rowwise_scales[(tile_row * BLOCK_TILE + unit) * (cols / BLOCK_TILE) + tile_col] =
                u32::reinterpret(1.0f32 / scale);
        }
        let mut c = 0u32;
        #[unroll]
        for g in 0..8usize {
            c = max(c, col_partial[g * BLOCK_TILE + unit]);
        }
        let scale = scale_from_amax(f32::reinterpret(c), config.rule);
        col_scale[unit] = scale;
        if columnwise_on {
            outputs.columnwise_scales[columnwise_scale_index(
                tile_col * BLOCK_TILE + unit,
                tile_row,
                g_start,
                g_rows,
                cols,
                false,
            )] = u32::reinterpret(1.0f32 / scale);
        }
    }
    sync_cube();

    // 3. Codes. Rowwise: two words a row. Columnwise `[K, M]`: a column's 16 codes are one vector.
    if rowwise_on {
        #[unroll(config.unroll)]
        for r in 0..16usize {
            let scale = row_scale[row_unit * TRANSPOSED_UNIT_ROWS + r];
            #[unroll]
            for half in 0..2usize {
                let mut word = 0u32;
                #[unroll]
                for b in 0..4usize {
                    let j = half * 4 + b;
                    let x = half_of_word(words[r * 4 + j / 2], j % 2 == 1, kind);
                    word = word | (encode_fp8_by(x * scale, fp8, config.encoder) << comptime![8 * b as u32]);
                }
                outputs.rowwise[((row0 + r) * cols + col0) / 4 + half] = word;
            }
        }
    }
    if columnwise_on {
        #[unroll(config.unroll)]
        for j in 0..8usize {
            let scale = col_scale[col_unit * 8 + j];
            let mut packed = Vector::<u32, N>::empty();
            #[unroll]
            for w in 0..4usize {
                let mut word = 0u32;
                #[unroll]
                for b in 0..4usize {
                    let r = w * 4 + b;
                    let x = half_of_word(words[r * 4 + j / 2], j % 2 == 1, kind);
                    word = word | (encode_fp8_by(x * scale, fp8, config.encoder) << comptime![8 * b as u32]);
                }
                packed[w] = word;
            }
            outputs.columnwise[(g_start * cols + (col0 + j) * g_rows + (row0 - g_start)) / 16] = packed;
        }
    }
}
