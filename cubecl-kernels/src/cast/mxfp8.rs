//! MXFP8: E8M0 scales per 1x32 (rowwise), 32x1 (columnwise) or 32x32 (2D) block, both directions
//! from one read. Host reference: `burn_lowp::format::mxfp8`.
//!
//! Three kernels, chosen by the launcher from the directions, block shape and input type:
//! - `mxfp8_kernel` (every case; the launcher takes it for f32 inputs): a cube of 128 units covers one 32-row
//!   block x 128 columns; each unit owns 4 rows x 8 columns. Block amaxes go through shared
//!   memory in two steps (per-unit partials, then one unit per block).
//! - `mxfp8_rowwise_kernel` (rowwise only, 1D): one unit per 1x32 block, no shared memory.
//! - `mxfp8_strip_kernel` (16-bit inputs: columnwise with or without rowwise, and 2D blocks in
//!   any direction): one unit per 32x4 column strip, column amaxes in registers.
//!
//! Codes are written as u32 words in the `[M, K]` layout for both directions; scales as bytes,
//! compact or GEMM-swizzled.

use crate::cast::codec::{e8m0_reciprocal, encode_fp8_by, float_to_e8m0, Fp8Encoder, Fp8Kind};
use crate::cast::flags::{COLUMNWISE, ROWWISE, SWIZZLED};
use crate::cast::kernel_choice::{fp8_encoder, tile_kernels_forced, unroll};
use crate::cast::output::{scale_bytes, DirectionOutput, Directions, QuantizeOutput};
use crate::cast::swizzle::{scale_index, swizzled_offset};
use crate::util::buffers::{arg, dummy};
use crate::util::elements::{abs_bits_for_amax, half_of_word, load_chunk, ElemKind};
use crate::util::error::KernelError;
use crate::util::grid::{ceil_div, linear_cubes, round_up};
use crate::util::matrix::{INPUT_VECTOR, InputMatrix};
use cubecl::prelude::*;

pub const MX_ROWS_PER_UNIT: usize = 4;
pub const MX_ROW_GROUPS: usize = 8;
pub const MX_STRIPS: usize = 16;
pub const MX_UNITS: usize = MX_ROW_GROUPS * MX_STRIPS;
pub const MX_TILE_ROWS: usize = 32;
pub const MX_TILE_COLS: usize = 8 * MX_STRIPS;
/// Blocks of 32 columns per tile.
const MX_TILE_KBLOCKS: usize = MX_TILE_COLS / 32;

#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub struct Mxfp8Config {
    pub kind: ElemKind,
    pub fp8: Fp8Kind,
    pub block_2d: bool,
    /// f32 bits of `1 / fp8_max`.
    pub reciprocal_max_bits: u32,
    /// Fully unroll the per-row / per-column loops (fast code; slow to compile on lavapipe).
    pub unroll: bool,
    pub encoder: Fp8Encoder,
}

/// Columns of the rowwise scale matrix: one E8M0 byte per 32 columns, padded to a multiple of 4.
#[cube]
fn padded_row_scale_cols(cols: usize) -> usize {
    (cols / 32 + 3) / 4 * 4
}

#[cube]
fn pack4(codes: &Array<u32>, base: usize) -> u32 {
    codes[base]
        | (codes[base + 1] << 8u32)
        | (codes[base + 2] << 16u32)
        | (codes[base + 3] << 24u32)
}

#[cube(launch_unchecked)]
pub fn mxfp8_kernel<N: Size>(
    input: &Array<Vector<u32, N>>,
    rowwise: &mut Array<u32>,
    rowwise_scales: &mut Array<u8>,
    columnwise: &mut Array<u32>,
    columnwise_scales: &mut Array<u8>,
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
            rowwise_scales[scale_index(row, global_kb, row_scale_cols, swizzled)] =
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
            columnwise_scales[index] = u8::cast_from(e);
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
                rowwise[word] = pack4(&codes, i * 8);
                rowwise[word + 1] = pack4(&codes, i * 8 + 4);
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
                columnwise[word] = pack4(&codes, i * 8);
                columnwise[word + 1] = pack4(&codes, i * 8 + 4);
            }
        }
    }
}

/// Rowwise-only MXFP8 with 1D blocks: one unit per 32-element block of a row, so the block's
/// amax stays in registers (no shared memory, no cube barrier) and the units of a warp cover 32
/// consecutive blocks of a row (2 KiB of bf16 in, 1 KiB of codes out, written as 16-byte
/// vectors). Same codes and scales as `mxfp8_kernel`; the launcher picks it when only rowwise
/// data is asked for (the forward activation of a GEMM on Blackwell).
#[cube(launch_unchecked)]
pub fn mxfp8_rowwise_kernel<N: Size>(
    input: &Array<Vector<u32, N>>,
    codes: &mut Array<Vector<u32, N>>,
    scales: &mut Array<u8>,
    rows: usize,
    cols: usize,
    flags: u32,
    #[comptime] config: Mxfp8Config,
) {
    let blocks_per_row = cols / 32;
    let block = ABSOLUTE_POS;
    if block < rows * blocks_per_row {
        let row = block / blocks_per_row;
        let kb = block % blocks_per_row;
        let start = row * cols + kb * 32;
        let mut values = Array::<f32>::new(32usize);
        #[unroll]
        for i in 0..4usize {
            load_chunk::<N>(input, start + i * 8, &mut values, i * 8, config.kind);
        }
        let mut amax = 0u32;
        #[unroll]
        for i in 0..32usize {
            amax = max(amax, abs_bits_for_amax(values[i]));
        }
        let reciprocal_max = f32::new(comptime![f32::from_bits(config.reciprocal_max_bits)]);
        let e = float_to_e8m0(f32::reinterpret(amax) * reciprocal_max);
        scales[scale_index(row, kb, padded_row_scale_cols(cols), (flags & SWIZZLED) != 0u32)] =
            u8::cast_from(e);
        let multiplier = e8m0_reciprocal(e);
        let mut block_codes = Array::<u32>::new(32usize);
        #[unroll]
        for i in 0..32usize {
            block_codes[i] = encode_fp8_by(values[i] * multiplier, config.fp8, config.encoder);
        }
        #[unroll]
        for half in 0..2usize {
            let mut packed = Vector::<u32, N>::empty();
            #[unroll]
            for w in 0..4usize {
                packed[w] = pack4(&block_codes, half * 16 + w * 4);
            }
            codes[start / 16 + half] = packed;
        }
    }
}

/// Units of `mxfp8_strip_kernel`, 4 columns each: a cube covers 32 rows x 512 columns.
pub const MX_STRIP_UNITS: usize = 128;
pub const MX_STRIP_TILE_COLS: usize = 4 * MX_STRIP_UNITS;
/// Row partials are `[unit][row]` with a padding word per unit: the 32 units of a warp writing
/// the same row hit 32 distinct banks.
const MX_PARTIAL_STRIDE: usize = MX_TILE_ROWS + 1;

/// MXFP8 for 16-bit inputs, one unit per 32x4 strip: the columnwise copy and/or the rowwise copy
/// (`with_columnwise`, `with_rowwise`), 1D or 2D (32x32) blocks. Same codes and scales as
/// `mxfp8_kernel`. A unit owns a whole 32x1 column block of 4 adjacent columns (32 rows x 8 bytes,
/// kept as raw words), so each column's amax is reduced in registers; a warp reads 256
/// contiguous bytes of a row per load and writes 128 contiguous code bytes per store, for both
/// copies (codes are `[M, K]` either way). Only blocks that span units go through shared memory:
/// a row's 1x32 block (8 units) and a 32x32 tile (8 units). `mxfp8_kernel`'s 4x8 units needed
/// two shared-memory rounds for the column blocks and wrote 8 bytes per unit per row (Nsight
/// Compute: 52 % of DRAM bandwidth columnwise, `benches/results/quantize-instruction-h100/`).
#[cube(launch_unchecked)]
pub fn mxfp8_strip_kernel<N: Size>(
    input: &Array<Vector<u32, N>>,
    rowwise: &mut Array<u32>,
    rowwise_scales: &mut Array<u8>,
    columnwise: &mut Array<u32>,
    columnwise_scales: &mut Array<u8>,
    rows: usize,
    cols: usize,
    flags: u32,
    #[comptime] config: Mxfp8Config,
    #[comptime] with_rowwise: bool,
    #[comptime] with_columnwise: bool,
) {
    let swizzled = (flags & SWIZZLED) != 0u32;
    let unit = UNIT_POS as usize;
    let tile_row = CUBE_POS_Y as usize;
    let tile_col0 = CUBE_POS_X as usize * MX_STRIP_TILE_COLS;
    let row0 = tile_row * MX_TILE_ROWS;
    let col0 = tile_col0 + unit * 4;
    // `cols` is a multiple of 32, so a unit's 4 columns are all in or all out, and so are the 8
    // units of a 32-column block.
    let active = col0 < cols;
    let kind = comptime![config.kind];
    let block_2d = comptime![config.block_2d];
    let row_partials = comptime![with_rowwise && !config.block_2d];
    let reciprocal_max = f32::new(comptime![f32::from_bits(config.reciprocal_max_bits)]);
    // The unit's 32-column block within the cube and within the matrix.
    let kb = unit / 8;
    let global_kb = tile_col0 / 32 + kb;

    // 1. Load 32 rows x 4 columns (2 words a row); column maxima in registers, 1D row partials to
    //    shared memory when the rowwise copy is asked for.
    let mut words = Array::<u32>::new(64usize);
    if active {
        #[unroll(config.unroll)]
        for r in 0..32usize {
            let v = input[((row0 + r) * cols + col0) / 4];
            words[r * 2] = v[0];
            words[r * 2 + 1] = v[1];
        }
    } else {
        #[unroll(config.unroll)]
        for i in 0..64usize {
            words[i] = 0u32;
        }
    }
    let mut col_amax = Array::<u32>::new(4usize);
    #[unroll]
    for j in 0..4usize {
        col_amax[j] = 0u32;
    }
    let mut row_partial = SharedMemory::<u32>::new(comptime![if row_partials {
        MX_STRIP_UNITS * MX_PARTIAL_STRIDE
    } else {
        1
    }]);
    #[unroll(config.unroll)]
    for r in 0..32usize {
        let mut m = 0u32;
        #[unroll]
        for j in 0..4usize {
            let a = abs_bits_for_amax(half_of_word(words[r * 2 + j / 2], j % 2 == 1, kind));
            m = max(m, a);
            col_amax[j] = max(col_amax[j], a);
        }
        if comptime![row_partials] {
            row_partial[unit * MX_PARTIAL_STRIDE + r] = m;
        }
    }

    // 2D: the 32x32 tile's amax over the 8 units of the block; every block of the tile (rowwise
    //     and columnwise) takes it.
    let mut tile_e = 0u32;
    if comptime![block_2d] {
        let mut unit_amax = SharedMemory::<u32>::new(MX_STRIP_UNITS);
        unit_amax[unit] = max(max(col_amax[0], col_amax[1]), max(col_amax[2], col_amax[3]));
        sync_cube();
        let mut t = 0u32;
        #[unroll]
        for s in 0..8usize {
            t = max(t, unit_amax[kb * 8 + s]);
        }
        #[unroll]
        for j in 0..4usize {
            col_amax[j] = t;
        }
        tile_e = float_to_e8m0(f32::reinterpret(t) * reciprocal_max);
    }

    // 2. Rowwise. 1D: unit u reduces rows 4(u%8)..+4 of block u/8 over its 8 units, writes their
    //    scale bytes and shares their multipliers. 2D: unit u writes the tile's byte for those
    //    rows. Then every unit encodes its 4 columns of each row.
    if comptime![with_rowwise] {
        let mut row_multiplier = SharedMemory::<f32>::new(comptime![if row_partials {
            16 * MX_PARTIAL_STRIDE
        } else {
            1
        }]);
        if comptime![row_partials] {
            sync_cube();
        }
        #[unroll]
        for i in 0..4usize {
            let r = (unit % 8) * 4 + i;
            let mut e = tile_e;
            if comptime![row_partials] {
                let mut m = 0u32;
                #[unroll]
                for s in 0..8usize {
                    m = max(m, row_partial[(kb * 8 + s) * MX_PARTIAL_STRIDE + r]);
                }
                e = float_to_e8m0(f32::reinterpret(m) * reciprocal_max);
                row_multiplier[kb * MX_PARTIAL_STRIDE + r] = e8m0_reciprocal(e);
            }
            if global_kb < cols / 32 {
                rowwise_scales[scale_index(row0 + r, global_kb, padded_row_scale_cols(cols), swizzled)] =
                    u8::cast_from(e);
            }
        }
        if comptime![row_partials] {
            sync_cube();
        }
        let tile_multiplier = e8m0_reciprocal(tile_e);
        if active {
            #[unroll(config.unroll)]
            for r in 0..32usize {
                let mut multiplier = tile_multiplier;
                if comptime![row_partials] {
                    multiplier = row_multiplier[kb * MX_PARTIAL_STRIDE + r];
                }
                let mut word = 0u32;
                #[unroll]
                for j in 0..4usize {
                    let x = half_of_word(words[r * 2 + j / 2], j % 2 == 1, kind);
                    word = word
                        | (encode_fp8_by(x * multiplier, config.fp8, config.encoder)
                            << comptime![8 * j as u32]);
                }
                rowwise[((row0 + r) * cols + col0) / 4] = word;
            }
        }
    }

    // 3. Columnwise: scales of the unit's 4 column blocks, then its codes.
    if comptime![with_columnwise] {
        if active {
            let col_scale_cols = (cols + 127) / 128 * 128;
            let col_scale_rows = (rows / 32 + 3) / 4 * 4;
            let mut multiplier = Array::<f32>::new(4usize);
            #[unroll]
            for j in 0..4usize {
                let e = float_to_e8m0(f32::reinterpret(col_amax[j]) * reciprocal_max);
                multiplier[j] = e8m0_reciprocal(e);
                let c = col0 + j;
                let index = select(
                    swizzled,
                    swizzled_offset(c, tile_row, col_scale_rows),
                    tile_row * col_scale_cols + c,
                );
                columnwise_scales[index] = u8::cast_from(e);
            }
            #[unroll(config.unroll)]
            for r in 0..32usize {
                let mut word = 0u32;
                #[unroll]
                for j in 0..4usize {
                    let x = half_of_word(words[r * 2 + j / 2], j % 2 == 1, kind);
                    word = word
                        | (encode_fp8_by(x * multiplier[j], config.fp8, config.encoder)
                            << comptime![8 * j as u32]);
                }
                columnwise[((row0 + r) * cols + col0) / 4] = word;
            }
        }
    }
}

/// Units per cube of the rowwise-only MXFP8 kernel (one unit per 32-element block).
const MX_ROWWISE_UNITS: usize = 256;

/// `mxfp8_strip_kernel` reads 2-word (8-byte) vectors: 4 columns of 16-bit values.
const MX_STRIP_VECTOR: usize = 2;

/// Byte sizes of MXFP8 compact scales: rowwise `[roundup(M,128), roundup(K/32,4)]`, columnwise
/// `[roundup(M/32,4), roundup(K,128)]`.
pub fn mxfp8_scale_shapes(rows: usize, cols: usize) -> ([usize; 2], [usize; 2]) {
    (
        [round_up(rows, 128), round_up(cols / 32, 4)],
        [round_up(rows / 32, 4), round_up(cols, 128)],
    )
}

/// MXFP8, E4M3 or E5M2 elements. Needs `M % 32 == 0` and `K % 32 == 0`.
pub fn quantize_mxfp8<R: Runtime>(
    client: &ComputeClient<R>,
    x: InputMatrix,
    fp8: Fp8Kind,
    block_2d: bool,
    directions: Directions,
    swizzled: bool,
) -> Result<QuantizeOutput, KernelError> {
    x.require_blocks(32, 32, "MXFP8")?;
    let n = x.rows * x.cols;
    let (row_shape, col_shape) = mxfp8_scale_shapes(x.rows, x.cols);
    let rowwise = if directions.rowwise {
        client.empty(n)
    } else {
        dummy(client)
    };
    let rowwise_scales = if directions.rowwise {
        scale_bytes(client, row_shape, Some([x.rows, x.cols / 32]))
    } else {
        dummy(client)
    };
    let columnwise = if directions.columnwise {
        client.empty(n)
    } else {
        dummy(client)
    };
    let columnwise_scales = if directions.columnwise {
        scale_bytes(client, col_shape, Some([x.rows / 32, x.cols]))
    } else {
        dummy(client)
    };
    let max = match fp8 {
        Fp8Kind::E4M3 => 448.0f32,
        Fp8Kind::E5M2 => 57344.0f32,
    };
    let config = Mxfp8Config {
        kind: x.kind,
        fp8,
        block_2d,
        reciprocal_max_bits: (1.0f32 / max).to_bits(),
        unroll: unroll(client),
        encoder: fp8_encoder(client),
    };
    let flags = directions.flags() | if swizzled { SWIZZLED } else { 0 };
    if (directions.columnwise || block_2d) && x.kind != ElemKind::F32 && !tile_kernels_forced() {
        // 16-bit input, columnwise or 2D blocks: one unit per 32x4 strip.
        unsafe {
            mxfp8_strip_kernel::launch_unchecked::<R>(
                client,
                CubeCount::Static(
                    ceil_div(x.cols, MX_STRIP_TILE_COLS) as u32,
                    (x.rows / MX_TILE_ROWS) as u32,
                    1,
                ),
                CubeDim::new_1d(MX_STRIP_UNITS as u32),
                MX_STRIP_VECTOR,
                x.arg(),
                arg(&rowwise, n / 4),
                arg(&rowwise_scales, row_shape[0] * row_shape[1]),
                arg(&columnwise, n / 4),
                arg(&columnwise_scales, col_shape[0] * col_shape[1]),
                x.rows,
                x.cols,
                flags,
                config,
                directions.rowwise,
                directions.columnwise,
            )
        };
    } else if directions.rowwise && !directions.columnwise && !block_2d {
        // Rowwise only with 1D blocks: one unit per block, no shared memory.
        unsafe {
            mxfp8_rowwise_kernel::launch_unchecked::<R>(
                client,
                linear_cubes(client, (n / 32).div_ceil(MX_ROWWISE_UNITS)),
                CubeDim::new_1d(MX_ROWWISE_UNITS as u32),
                INPUT_VECTOR,
                x.arg(),
                arg(&rowwise, n / 4),
                arg(&rowwise_scales, row_shape[0] * row_shape[1]),
                x.rows,
                x.cols,
                flags,
                config,
            )
        };
    } else {
        unsafe {
            mxfp8_kernel::launch_unchecked::<R>(
                client,
                CubeCount::Static(
                    ceil_div(x.cols, MX_TILE_COLS) as u32,
                    (x.rows / MX_TILE_ROWS) as u32,
                    1,
                ),
                CubeDim::new_1d(MX_UNITS as u32),
                INPUT_VECTOR,
                x.arg(),
                arg(&rowwise, n / 4),
                arg(&rowwise_scales, row_shape[0] * row_shape[1]),
                arg(&columnwise, n / 4),
                arg(&columnwise_scales, col_shape[0] * col_shape[1]),
                x.rows,
                x.cols,
                flags,
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
