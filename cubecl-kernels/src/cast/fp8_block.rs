//! FP8 block scaling: f32 scales per 1x128 block or 128x128 tile, rowwise `[M, K]` and transposed
//! columnwise `[K, M]` (blocks along M) codes from one read. Host reference:
//! `burn_lowp::format::fp8_block`.
//!
//! Two kernels, one cube per 128x128 tile, block maxima reduced through shared memory (partials,
//! then one unit per row/column):
//! - `fp8_block_kernel` (every case; the launcher takes it for the rowwise copy alone and for f32
//!   inputs): 512 units of 4 rows x 8 columns;
//! - `fp8_block_transposed_kernel` (16-bit inputs with the transposed copy, grouped rows too): 128
//!   units of 16 rows x 8 columns, shaped for 16-byte transposed stores.
//!
//! Scales are `scale_inv` f32 bits: rowwise `[M, K/128]` (1D) or `[M/128, K/128]` (2D), columnwise
//! `[K, M/128]` (1D) or `[K/128, M/128]` (2D).

use crate::cast::codec::{encode_fp8_by, Fp8Encoder};
use crate::cast::flags::{COLUMNWISE, ROWWISE};
use crate::cast::kernel_choice::{fp8_encoder, tile_kernels_forced, unroll};
use crate::cast::output::{DirectionOutput, Directions, QuantizeOutput};
use crate::cast::scale::{scale_from_amax, ScaleRule};
use crate::grouped::group_layout::{group_args, group_of_row, require_grouped_rows, RowGroups};
use crate::util::buffers::{arg, dummy};
use crate::util::elements::{abs_bits_for_amax, half_of_word, load_chunk, ElemKind};
use crate::util::error::KernelError;
use crate::util::matrix::{INPUT_VECTOR, InputMatrix};
use cubecl::prelude::*;

pub const BLOCK_ROWS_PER_UNIT: usize = 4;
pub const BLOCK_ROW_GROUPS: usize = 32;
pub const BLOCK_STRIPS: usize = 16;
pub const BLOCK_UNITS: usize = BLOCK_ROW_GROUPS * BLOCK_STRIPS;
pub const BLOCK_TILE: usize = 128;

#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub struct Fp8BlockKernelConfig {
    pub kind: ElemKind,
    pub rule: ScaleRule,
    pub block_2d: bool,
    /// Fully unroll the per-row / per-column loops (fast code; slow to compile on lavapipe).
    pub unroll: bool,
    /// Rows form groups (multiples of 128 rows) whose columnwise copies are transposed each on
    /// its own: codes `[cols, rows_g]` at `start_g * cols`, scales `[cols, rows_g / 128]` (1x128)
    /// or `[cols / 128, rows_g / 128]` (128x128) at `start_g / 128` scale rows. Rowwise data does
    /// not change: its blocks never cross rows.
    pub grouped: bool,
    pub encoder: Fp8Encoder,
}

/// The group of rows a 128-row tile lies in, as `(first row, rows)` (see
/// `Fp8BlockKernelConfig::grouped`); ungrouped, the matrix is the one group.
#[cube]
fn tile_group(
    group_start: &Array<u32>,
    group_rows: &Array<u32>,
    groups: usize,
    rows: usize,
    tile_row: usize,
    #[comptime] grouped: bool,
) -> (usize, usize) {
    let (_g, g_start, g_rows) =
        group_of_row(group_start, group_rows, groups, rows, tile_row * BLOCK_TILE, grouped);
    (g_start, g_rows)
}

/// Where the columnwise `scale_inv` of column block `c` (1x128: a column; 128x128: a tile
/// column) of tile row `tile_row` goes: its group's scales follow the earlier groups', each
/// group transposed on its own (`[cols, rows_g / 128]` or `[cols / 128, rows_g / 128]`).
#[cube]
fn columnwise_scale_index(
    c: usize,
    tile_row: usize,
    g_start: usize,
    g_rows: usize,
    cols: usize,
    #[comptime] block_2d: bool,
) -> usize {
    let row_len = if comptime![block_2d] {
        cols / BLOCK_TILE
    } else {
        cols
    };
    (g_start / BLOCK_TILE) * row_len + c * (g_rows / BLOCK_TILE) + tile_row - g_start / BLOCK_TILE
}

#[cube(launch_unchecked)]
pub fn fp8_block_kernel<N: Size>(
    input: &Array<Vector<u32, N>>,
    rowwise: &mut Array<u32>,
    rowwise_scales: &mut Array<u32>,
    columnwise: &mut Array<u32>,
    columnwise_scales: &mut Array<u32>,
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
                rowwise_scales[tile_row * k_blocks + tile_col] = u32::reinterpret(scale_inv);
            }
            if columnwise_on {
                columnwise_scales[columnwise_scale_index(
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
            rowwise_scales[(tile_row * BLOCK_TILE + unit) * k_blocks + tile_col] =
                u32::reinterpret(scale_inv);
        }
    } else if unit < 2 * BLOCK_TILE {
        if columnwise_on {
            let c = unit - BLOCK_TILE;
            let scale_inv = 1.0f32 / scale_from_amax(f32::reinterpret(col_amax[c]), config.rule);
            columnwise_scales[columnwise_scale_index(
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
                rowwise[word] = low;
                rowwise[word + 1] = high;
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
            rowwise[((tile_row * BLOCK_TILE + r) * cols + tile_col * BLOCK_TILE) / 4 + w] =
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
            columnwise[word] = codes[j]
                | (codes[8 + j] << 8u32)
                | (codes[16 + j] << 16u32)
                | (codes[24 + j] << 24u32);
        }
    }
}

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
    rowwise: &mut Array<u32>,
    rowwise_scales: &mut Array<u32>,
    columnwise: &mut Array<Vector<u32, N>>,
    columnwise_scales: &mut Array<u32>,
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
                rowwise_scales[tile_row * (cols / BLOCK_TILE) + tile_col] = scale_inv;
            }
            if columnwise_on {
                columnwise_scales[columnwise_scale_index(
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
            rowwise_scales[(tile_row * BLOCK_TILE + unit) * (cols / BLOCK_TILE) + tile_col] =
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
            columnwise_scales[columnwise_scale_index(
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
                rowwise[((row0 + r) * cols + col0) / 4 + half] = word;
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
            columnwise[(g_start * cols + (col0 + j) * g_rows + (row0 - g_start)) / 16] = packed;
        }
    }
}

/// FP8 block scaling (1x128 or 128x128). Needs `M % 128 == 0` and `K % 128 == 0`.
pub fn quantize_fp8_block<R: Runtime>(
    client: &ComputeClient<R>,
    x: InputMatrix,
    rule: ScaleRule,
    block_2d: bool,
    directions: Directions,
    groups: Option<RowGroups>,
) -> Result<QuantizeOutput, KernelError> {
    x.require_blocks(BLOCK_TILE, BLOCK_TILE, "FP8 block scaling")?;
    require_grouped_rows(&x, groups)?;
    let n = x.rows * x.cols;
    let (mb, kb) = (x.rows / BLOCK_TILE, x.cols / BLOCK_TILE);
    let (row_scales, col_scales) = if block_2d {
        (mb * kb, mb * kb)
    } else {
        (x.rows * kb, x.cols * mb)
    };
    let rowwise = if directions.rowwise {
        client.empty(n)
    } else {
        dummy(client)
    };
    let rowwise_scales = if directions.rowwise {
        client.empty(row_scales * 4)
    } else {
        dummy(client)
    };
    let columnwise = if directions.columnwise {
        client.empty(n)
    } else {
        dummy(client)
    };
    let columnwise_scales = if directions.columnwise {
        client.empty(col_scales * 4)
    } else {
        dummy(client)
    };
    let config = Fp8BlockKernelConfig {
        kind: x.kind,
        rule,
        block_2d,
        unroll: unroll(client),
        grouped: groups.is_some(),
        encoder: fp8_encoder(client),
    };
    let (group_start, group_rows, count) = group_args(client, groups);
    if directions.columnwise && x.kind != ElemKind::F32 && !tile_kernels_forced() {
        // 16-bit input with the transposed copy: units shaped for the transposed stores.
        unsafe {
            fp8_block_transposed_kernel::launch_unchecked::<R>(
                client,
                CubeCount::Static(kb as u32, mb as u32, 1),
                CubeDim::new_1d(TRANSPOSED_UNITS as u32),
                INPUT_VECTOR,
                x.arg(),
                arg(&rowwise, n / 4),
                arg(&rowwise_scales, row_scales),
                arg(&columnwise, n / 4),
                arg(&columnwise_scales, col_scales),
                group_start,
                group_rows,
                x.rows,
                x.cols,
                count,
                directions.flags(),
                config,
            )
        };
    } else {
        unsafe {
            fp8_block_kernel::launch_unchecked::<R>(
                client,
                CubeCount::Static(kb as u32, mb as u32, 1),
                CubeDim::new_1d(BLOCK_UNITS as u32),
                INPUT_VECTOR,
                x.arg(),
                arg(&rowwise, n / 4),
                arg(&rowwise_scales, row_scales),
                arg(&columnwise, n / 4),
                arg(&columnwise_scales, col_scales),
                group_start,
                group_rows,
                x.rows,
                x.cols,
                count,
                directions.flags(),
                config,
            )
        };
    }
    Ok(QuantizeOutput::kept(
        directions,
        DirectionOutput {
            codes: rowwise,
            scales: rowwise_scales,
            amax: None,
        },
        DirectionOutput {
            codes: columnwise,
            scales: columnwise_scales,
            amax: None,
        },
    ))
}
