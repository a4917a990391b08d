//! `fp8_cast_transposed_kernel`, the FP8 per-tensor cast of 16-bit inputs writing both copies:
//! 64 units of 16 rows x 8 columns per 32 x 256 tile, each column's 16 codes one 16-byte store.

use cubecl::prelude::*;

use crate::cast::codec::encode_fp8_by;
use crate::cast::fp8::{FP8_TILE_COLS, FP8_TILE_ROWS, Fp8CastConfig};
use crate::cast::fp8::group_scale::{record_group_amax, tile_group_and_scale, write_scale_invs};
use crate::util::elements::abs_bits_for_amax;
use crate::util::pairs::vector_element;

/// Units of `fp8_cast_transposed_kernel`: 2 along M (16 rows each) by 32 along K (8 columns
/// each) cover the same 32 x 256 tile as `fp8_cast_kernel`'s 256 units.
pub const FP8_TRANSPOSED_UNITS: usize = 64;
const TRANSPOSED_UNIT_ROWS: usize = 16;

/// `fp8_cast_kernel` for 16-bit inputs writing the rowwise and the transposed columnwise copy (no
/// activation prologue): the same codes, scales and amaxes, with units of 16 rows x 8 columns
/// shaped for the transposed stores, as `fp8_block_transposed_kernel`'s. A unit loads one 16-byte vector a row
/// (a warp reads 256 contiguous bytes from each of two rows) and stores each of its columns' 16
/// codes as one 16-byte vector beside the other row unit's 16 (full 32-byte sectors), where the
/// 4 x 8 units wrote 4-byte words, eight 32-byte runs a warp store. Each value is encoded once
/// and packed into its row's word and its column's word.
#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
pub fn fp8_cast_transposed_kernel<N: Size>(
    input: &Array<Vector<u32, N>>,
    scale_source: &Array<u32>,
    group_start: &Array<u32>,
    group_rows: &Array<u32>,
    row_index: &Array<u32>,
    rowwise: &mut Array<u32>,
    columnwise: &mut Array<Vector<u32, N>>,
    scale_inv_out: &mut Array<u32>,
    amax_out: &mut Array<Atomic<u32>>,
    amax_history: &mut Array<Atomic<u32>>,
    rows: usize,
    cols: usize,
    groups: usize,
    src_rows: usize,
    scale_first: usize,
    scale_stride: usize,
    history_first: usize,
    history_stride: usize,
    #[comptime] config: Fp8CastConfig,
) {
    let unit = UNIT_POS as usize;
    // The two row units of a strip are neighbours in a warp: their column stores meet.
    let row_unit = unit % 2;
    let strip = unit / 2;
    let tile_row0 = CUBE_POS_Y as usize * FP8_TILE_ROWS;
    let row0 = tile_row0 + row_unit * TRANSPOSED_UNIT_ROWS;
    let col0 = CUBE_POS_X as usize * FP8_TILE_COLS + strip * 8;
    // Rows and columns are multiples of 16 (`fp8_cast_matrix`): an active unit is whole.
    let active = row0 < rows && col0 < cols;

    let (g, g_start, g_rows, in_group, scale) = tile_group_and_scale(
        scale_source,
        group_start,
        group_rows,
        rows,
        groups,
        scale_first,
        scale_stride,
        tile_row0,
        config,
        FP8_TRANSPOSED_UNITS,
    );

    let mut local_amax = 0u32;
    if active {
        // All 16 loads in flight before any is used.
        let mut words = Array::<Vector<u32, N>>::new(TRANSPOSED_UNIT_ROWS);
        #[unroll]
        for r in 0..TRANSPOSED_UNIT_ROWS {
            if comptime![config.gathered] {
                let src = usize::cast_from(row_index[row0 + r]);
                let mut v = Vector::<u32, N>::empty();
                if src < src_rows {
                    v = input[(src * cols + col0) / 8];
                } else {
                    #[unroll]
                    for w in 0..4usize {
                        v[w] = 0u32;
                    }
                }
                words[r] = v;
            } else {
                words[r] = input[((row0 + r) * cols + col0) / 8];
            }
        }
        // Column j's codes along M: word q of column j holds rows 4q..4q+4.
        let mut column = Array::<u32>::new(32usize);
        #[unroll]
        for r in 0..TRANSPOSED_UNIT_ROWS {
            let mut row_words = Array::<u32>::new(2usize);
            #[unroll]
            for j in 0..8usize {
                let x = vector_element::<N>(words[r], j / 2, j % 2, config.kind);
                if comptime![config.record_amax] {
                    local_amax = max(local_amax, abs_bits_for_amax(x));
                }
                let code = encode_fp8_by(x * scale, config.fp8, config.encoder);
                if comptime![j % 4 == 0] {
                    row_words[j / 4] = code;
                } else {
                    row_words[j / 4] = row_words[j / 4] | (code << comptime![8 * (j % 4) as u32]);
                }
                if comptime![r % 4 == 0] {
                    column[j * 4 + r / 4] = code;
                } else {
                    column[j * 4 + r / 4] = column[j * 4 + r / 4] | (code << comptime![8 * (r % 4) as u32]);
                }
            }
            if comptime![config.rowwise] {
                let word = ((row0 + r) * cols + col0) / 4;
                rowwise[word] = row_words[0];
                rowwise[word + 1] = row_words[1];
            }
        }
        if comptime![config.columnwise] {
            if in_group {
                #[unroll]
                for j in 0..8usize {
                    let mut packed = Vector::<u32, N>::empty();
                    #[unroll]
                    for q in 0..4usize {
                        packed[q] = column[j * 4 + q];
                    }
                    columnwise[(g_start * cols + (col0 + j) * g_rows + (row0 - g_start)) / 16] = packed;
                }
            }
        }
    }
    record_group_amax(
        local_amax,
        in_group,
        g,
        amax_out,
        amax_history,
        history_first,
        history_stride,
        config,
        FP8_TRANSPOSED_UNITS,
    );
    if CUBE_POS == 0 {
        write_scale_invs(
            scale,
            scale_source,
            scale_inv_out,
            groups,
            scale_first,
            scale_stride,
            config,
            FP8_TRANSPOSED_UNITS,
        );
    }
}
