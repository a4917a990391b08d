//! `nvfp4_kernel`: a cube of 256 units stages a 64 x 64 tile in shared memory as f32; then every
//! unit quantizes one rowwise block (16 columns of a row) and one columnwise block (16 rows of a
//! column, where the RHT runs), each from 16 registers. The launcher takes it for f32 inputs and
//! for stochastic rounding with the columnwise copy.

use cubecl::prelude::*;

use crate::cast::flags::{COLUMNWISE, ROWWISE, SWIZZLED};
use crate::cast::hadamard::rht16;
use crate::cast::nvfp4::Nvfp4KernelConfig;
use crate::cast::nvfp4::blocks::{block_amax16, encode_block16};
use crate::cast::output::CastOutputs;
use crate::cast::scale::{nvfp4_block_scale, nvfp4_element_scale, nvfp4_global_encode_scale};
use crate::cast::swizzle::scale_index;
use crate::grouped::group_layout::group_of_row;
use crate::util::elements::load_chunk;

/// A cube stages a 64 x 64 tile in shared memory.
pub const NV_TILE: usize = 64;
pub const NV_UNITS: usize = 256;
/// Shared-memory row stride (one padding column keeps column reads conflict-free).
const NV_STRIDE: usize = NV_TILE + 1;
/// 16-element blocks along one tile side.
const NV_BLOCKS: usize = NV_TILE / 16;

/// One cube per 64 x 64 tile: (1) 256 units load it into shared memory, (2) each unit takes one
/// rowwise block (a row's 16 columns) and (3) one columnwise block (a column's 16 rows, RHT'd),
/// computing amax, E4M3 scale and codes from registers.
///
/// `amax` holds the global amaxes, `[rowwise, columnwise]` per group; `keys` the stochastic
/// rounding keys, `[rowwise, columnwise]` per group.
#[cube(launch_unchecked)]
pub fn nvfp4_kernel<N: Size>(
    input: &Array<Vector<u32, N>>,
    rowwise_amax: &Array<u32>,
    columnwise_amax: &Array<u32>,
    keys: &Array<u32>,
    group_start: &Array<u32>,
    group_rows: &Array<u32>,
    outputs: &mut CastOutputs<u32, u8>,
    rows: usize,
    cols: usize,
    groups: usize,
    flags: u32,
    #[comptime] config: Nvfp4KernelConfig,
) {
    let swizzled = (flags & SWIZZLED) != 0u32;
    let unit = UNIT_POS as usize;
    let tile_row0 = CUBE_POS_Y as usize * NV_TILE;
    let tile_col0 = CUBE_POS_X as usize * NV_TILE;
    let (g, g_start, g_rows) =
        group_of_row(group_start, group_rows, groups, rows, tile_row0, config.grouped);
    // A tile past the last group (the zero tail) writes rowwise codes only.
    let in_group = tile_row0 - g_start < g_rows;
    let rowwise_key = keys[2 * g];
    let columnwise_key = keys[2 * g + 1];

    // (1) Load: unit u covers row u / 4, columns 16 * (u % 4) .. + 16.
    let mut tile = SharedMemory::<f32>::new(NV_TILE * NV_STRIDE);
    let mut v = Array::<f32>::new(16usize);
    {
        let r = unit / NV_BLOCKS;
        let c = (unit % NV_BLOCKS) * 16;
        let in_bounds = tile_row0 + r < rows && tile_col0 + c < cols;
        if in_bounds {
            let start = (tile_row0 + r) * cols + tile_col0 + c;
            load_chunk::<N>(input, start, &mut v, 0usize, config.kind);
            load_chunk::<N>(input, start + 8, &mut v, 8usize, config.kind);
        }
        #[unroll]
        for i in 0..16usize {
            tile[r * NV_STRIDE + c + i] = select(in_bounds, v[i], 0.0f32);
        }
    }
    sync_cube();

    // Rowwise block of this unit: row r, columns 16 b .. + 16; its amax feeds the 2D tiles too.
    let r = unit / NV_BLOCKS;
    let b = unit % NV_BLOCKS;
    let row_ok = tile_row0 + r < rows && tile_col0 + b * 16 < cols;
    #[unroll]
    for i in 0..16usize {
        v[i] = tile[r * NV_STRIDE + b * 16 + i];
    }
    let row_block_amax = block_amax16(&v);
    let mut tile_amax = SharedMemory::<u32>::new(NV_BLOCKS * NV_BLOCKS);
    if comptime![config.block_2d] {
        let mut row_amax = SharedMemory::<u32>::new(NV_TILE * NV_BLOCKS);
        row_amax[unit] = row_block_amax;
        sync_cube();
        if unit < NV_BLOCKS * NV_BLOCKS {
            // 16x16 tile (i, j) = max over its 16 rows of block j.
            let ti = unit / NV_BLOCKS;
            let tj = unit % NV_BLOCKS;
            let mut m = 0u32;
            for k in 0..16usize {
                let a = row_amax[(ti * 16 + k) * NV_BLOCKS + tj];
                m = select(a > m, a, m);
            }
            tile_amax[unit] = m;
        }
        sync_cube();
    }

    // (2) Rowwise codes [M, K/2] and scales.
    if (flags & ROWWISE) != 0u32 && row_ok {
        let row = tile_row0 + r;
        let col0 = tile_col0 + b * 16;
        let s_enc = nvfp4_global_encode_scale(f32::reinterpret(rowwise_amax[g]));
        let s_dec = 1.0f32 / s_enc;
        let multiplier = s_enc * 0.16666667f32; // S_enc * (1/6)
        let amax = if comptime![config.block_2d] {
            tile_amax[(r / 16) * NV_BLOCKS + b]
        } else {
            row_block_amax
        };
        let byte = nvfp4_block_scale(f32::reinterpret(amax), multiplier);
        let row_scale_cols = (cols / 16 + 3) / 4 * 4;
        outputs.rowwise_scales[scale_index(row, col0 / 16, row_scale_cols, swizzled)] = u8::cast_from(byte);
        let enc = nvfp4_element_scale(byte, s_dec);
        let (low, high) = encode_block16(
            &v,
            enc,
            config.stochastic,
            rowwise_key,
            u32::cast_from((row - g_start) * cols + col0),
        );
        let word = (row * cols + col0) / 8;
        outputs.rowwise[word] = low;
        outputs.rowwise[word + 1] = high;
    }

    // (3) Columnwise codes [K, M/2]: unit takes column u / 4, rows 16 (u % 4) .. + 16, so four
    // neighbouring units write one contiguous 32-byte run of a transposed row.
    if (flags & COLUMNWISE) != 0u32 && in_group {
        let c = unit / NV_BLOCKS;
        let j = unit % NV_BLOCKS;
        let col = tile_col0 + c;
        let row0 = tile_row0 + j * 16;
        if col < cols && row0 < rows {
            #[unroll]
            for i in 0..16usize {
                v[i] = tile[(j * 16 + i) * NV_STRIDE + c];
            }
            if comptime![config.rht] {
                rht16(&mut v, 0usize, 1usize, config.kind);
            }
            let s_enc = nvfp4_global_encode_scale(f32::reinterpret(columnwise_amax[g]));
            let s_dec = 1.0f32 / s_enc;
            let multiplier = s_enc * 0.16666667f32;
            let amax = if comptime![config.block_2d] {
                tile_amax[j * NV_BLOCKS + c / 16]
            } else {
                block_amax16(&v)
            };
            let byte = nvfp4_block_scale(f32::reinterpret(amax), multiplier);
            let local_row0 = row0 - g_start;
            let col_scale_cols = (g_rows / 16 + 3) / 4 * 4;
            let group_scales = (g_start / 16) * ((cols + 127) / 128 * 128);
            outputs.columnwise_scales
                [group_scales + scale_index(col, local_row0 / 16, col_scale_cols, swizzled)] =
                u8::cast_from(byte);
            let enc = nvfp4_element_scale(byte, s_dec);
            let (low, high) = encode_block16(
                &v,
                enc,
                config.stochastic,
                columnwise_key,
                u32::cast_from(col * g_rows + local_row0),
            );
            let word = (g_start * cols + col * g_rows + local_row0) / 8;
            outputs.columnwise[word] = low;
            outputs.columnwise[word + 1] = high;
        }
    }
}
