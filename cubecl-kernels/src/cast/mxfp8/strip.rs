//! `mxfp8_strip_kernel`, MXFP8 for 16-bit inputs with the columnwise copy or 2D blocks: one unit
//! per 32x4 column strip, column amaxes in registers.

use cubecl::prelude::*;

use crate::cast::codec::{e8m0_reciprocal, encode_fp8_by, float_to_e8m0};
use crate::cast::flags::SWIZZLED;
use crate::cast::mxfp8::{padded_row_scale_cols, MX_TILE_ROWS, Mxfp8Config};
use crate::cast::output::CastOutputs;
use crate::cast::swizzle::{scale_index, swizzled_offset};
use crate::util::elements::{abs_bits_for_amax, half_of_word};

/// Units of `mxfp8_strip_kernel`, 4 columns each: a cube covers 32 rows x 512 columns.
pub const MX_STRIP_UNITS: usize = 128;
pub const MX_STRIP_TILE_COLS: usize = 4 * MX_STRIP_UNITS;
/// Row partials are `[unit][row]` with a padding word per unit: the 32 units of a warp writing
/// the same row hit 32 distinct banks.
const MX_PARTIAL_STRIDE: usize = MX_TILE_ROWS + 1;

/// `mxfp8_strip_kernel` reads 2-word (8-byte) vectors: 4 columns of 16-bit values.
pub(crate) const MX_STRIP_VECTOR: usize = 2;

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
    outputs: &mut CastOutputs<u32, u8>,
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
                outputs.rowwise_scales[scale_index(row0 + r, global_kb, padded_row_scale_cols(cols), swizzled)] =
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
                outputs.rowwise[((row0 + r) * cols + col0) / 4] = word;
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
                outputs.columnwise_scales[index] = u8::cast_from(e);
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
                outputs.columnwise[((row0 + r) * cols + col0) / 4] = word;
            }
        }
    }
}
