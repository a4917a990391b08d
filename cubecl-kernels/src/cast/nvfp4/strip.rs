//! `nvfp4_strip_kernel`: NVFP4 for the other 16-bit cases (the columnwise copy, 2D blocks, row
//! groups), one unit per 16 rows x 8 columns.

use cubecl::prelude::*;

use crate::cast::flags::SWIZZLED;
use crate::cast::hadamard::rht16;
use crate::cast::nvfp4::Nvfp4KernelConfig;
use crate::cast::nvfp4::blocks::{clear_nans, encode_word8, nan_free_amax};
use crate::cast::output::CastOutputs;
use crate::cast::scale::{nvfp4_block_scale, nvfp4_element_scale, nvfp4_global_encode_scale};
use crate::cast::swizzle::scale_index;
use crate::grouped::group_layout::group_of_row;
use crate::util::elements::{abs_bits_for_amax, half_of_word, ElemKind};

/// Units of `nvfp4_strip_kernel`: 4 along M (16 rows each) by 32 along K (8 columns each), so a
/// cube covers 64 rows x 256 columns.
pub const NV_STRIP_ROW_UNITS: usize = 4;
pub const NV_STRIP_COL_UNITS: usize = 32;
pub const NV_STRIP_UNITS: usize = NV_STRIP_ROW_UNITS * NV_STRIP_COL_UNITS;
pub const NV_STRIP_TILE_ROWS: usize = 16 * NV_STRIP_ROW_UNITS;
pub const NV_STRIP_TILE_COLS: usize = 8 * NV_STRIP_COL_UNITS;
/// Row partials are `[unit][row]` with a padding word per unit: 32 units writing the same row hit
/// 32 distinct banks.
const NV_PARTIAL_STRIDE: usize = 17;

/// Row maxima (as bits) of a strip unit's 16 rows x 8 columns, into `row_max`; returns their
/// max. `skip_nan`: NaNs count as 0 (`abs_bits_for_amax`); otherwise the sign-cleared bits are
/// compared as they are (two instructions an element instead of four) and a result above +inf
/// says there is a NaN.
#[cube]
fn strip_row_maxima(
    words: &Array<u32>,
    row_max: &mut Array<u32>,
    #[comptime] kind: ElemKind,
    #[comptime] skip_nan: bool,
    #[comptime] unroll: bool,
) -> u32 {
    let mut unit_max = 0u32;
    #[unroll(unroll)]
    for r in 0..16usize {
        let mut m = 0u32;
        #[unroll]
        for j in 0..8usize {
            let x = half_of_word(words[r * 4 + j / 2], j % 2 == 1, kind);
            let a = if comptime![skip_nan] {
                abs_bits_for_amax(x)
            } else {
                u32::reinterpret(x) & 0x7FFF_FFFFu32
            };
            m = max(m, a);
        }
        row_max[r] = m;
        unit_max = max(unit_max, m);
    }
    unit_max
}

/// NVFP4 for 16-bit inputs with the columnwise copy (and the rowwise copy when `with_rowwise`),
/// or 2D / grouped rowwise-only: one unit per 16 rows x 8 columns, the columnwise blocks (a
/// column's 16 rows, RHT'd when asked) reduced and encoded from the unit's registers. Same codes
/// and scales as `nvfp4_kernel`.
///
/// Unit u is row unit `u % 4`, column unit `u / 4`: a warp's loads read 128 contiguous bytes from
/// each of 4 rows, its columnwise stores write a column's 4 x 8 code bytes (4 row units, 64
/// rows) as one 32-byte sector, its rowwise stores 32 contiguous bytes of each of 4 rows. The
/// only values that cross units are a row's 1x16 block amax and a 16x16 tile's amax, both shared
/// by the neighbouring column unit (`u ^ 4`) through shared memory. `nvfp4_kernel` stages the
/// whole tile as f32 in shared memory and re-reads it per direction.
///
/// NaN inputs are rare: a unit finds them in its row maxima, and only then takes its maxima again
/// skipping them and replaces them by +0 (NaN's code) in each row before encoding; columns are
/// cleared by `nan_free_amax` after the RHT, which spreads a NaN over its block as the
/// reference does.
#[cube(launch_unchecked)]
pub fn nvfp4_strip_kernel<N: Size>(
    input: &Array<Vector<u32, N>>,
    rowwise_amax: &Array<u32>,
    columnwise_amax: &Array<u32>,
    keys: &Array<u32>,
    group_start: &Array<u32>,
    group_rows: &Array<u32>,
    outputs: &mut CastOutputs<Vector<u32, Const<2>>, u8>,
    rows: usize,
    cols: usize,
    groups: usize,
    flags: u32,
    #[comptime] config: Nvfp4KernelConfig,
    #[comptime] with_rowwise: bool,
    #[comptime] with_columnwise: bool,
) {
    let swizzled = (flags & SWIZZLED) != 0u32;
    let kind = comptime![config.kind];
    let unit = UNIT_POS as usize;
    let row_unit = unit % NV_STRIP_ROW_UNITS;
    let col_unit = unit / NV_STRIP_ROW_UNITS;
    let partner = unit ^ NV_STRIP_ROW_UNITS;
    let tile_row0 = CUBE_POS_Y as usize * NV_STRIP_TILE_ROWS;
    let row0 = tile_row0 + row_unit * 16;
    let col0 = CUBE_POS_X as usize * NV_STRIP_TILE_COLS + col_unit * 8;
    // `rows` and `cols` are multiples of 16, so a unit and its partner are in or out together.
    let active = row0 < rows && col0 < cols;
    // Groups are multiples of 128 rows: a cube's 64 rows lie in one group.
    let (g, g_start, g_rows) =
        group_of_row(group_start, group_rows, groups, rows, tile_row0, config.grouped);
    // Rows past the last group (the zero tail) have rowwise codes only.
    let in_group = tile_row0 - g_start < g_rows;
    let block_2d = comptime![config.block_2d];
    let row_partials = comptime![with_rowwise && !config.block_2d];

    // 1. Load 16 rows x 8 columns (4 words a row) and take each row's maximum.
    let mut words = Array::<u32>::new(64usize);
    if active {
        #[unroll]
        for r in 0..16usize {
            let w = input[((row0 + r) * cols + col0) / 8];
            #[unroll]
            for k in 0..4usize {
                words[r * 4 + k] = w[k];
            }
        }
    } else {
        #[unroll]
        for k in 0..64usize {
            words[k] = 0u32;
        }
    }
    let mut row_max = Array::<u32>::new(16usize);
    let mut unit_max = strip_row_maxima(&words, &mut row_max, kind, false, config.unroll);
    let has_nan = unit_max > 0x7F80_0000u32;
    if has_nan {
        unit_max = strip_row_maxima(&words, &mut row_max, kind, true, config.unroll);
    }

    // 2D: the 16x16 tile's amax is this unit's and its partner's maximum.
    let mut tile_amax = 0u32;
    if comptime![block_2d] {
        let mut unit_amax = SharedMemory::<u32>::new(NV_STRIP_UNITS);
        unit_amax[unit] = unit_max;
        sync_cube();
        tile_amax = max(unit_max, unit_amax[partner]);
    }
    let mut v = Array::<f32>::new(16usize);

    // 2. Rowwise: row r's 1x16 block amax is the max of this unit's and its partner's row
    //    maxima; the even column unit writes the scale byte, each unit its 8 codes (one word).
    //    The row loop is not unrolled and reloads its row (an L1 or L2 hit: the unit read it
    //    above): unrolled, the rowwise and columnwise passes together overflowed the
    //    instruction cache (Nsight Compute, both directions: 34 % of DRAM bandwidth, warps
    //    mostly stalled on instruction fetch).
    if comptime![with_rowwise] {
        let mut row_partial = SharedMemory::<u32>::new(comptime![if row_partials {
            NV_STRIP_UNITS * NV_PARTIAL_STRIDE
        } else {
            1
        }]);
        if comptime![row_partials] {
            #[unroll(config.unroll)]
            for r in 0..16usize {
                row_partial[unit * NV_PARTIAL_STRIDE + r] = row_max[r];
            }
            sync_cube();
        }
        if active {
            let s_enc = nvfp4_global_encode_scale(f32::reinterpret(rowwise_amax[g]));
            let s_dec = 1.0f32 / s_enc;
            let multiplier = s_enc * 0.16666667f32;
            let row_scale_cols = (cols / 16 + 3) / 4 * 4;
            let writes_scale = (col_unit % 2) == 0;
            let key = keys[2 * g];
            for r in 0..16usize {
                let mut amax = tile_amax;
                if comptime![row_partials] {
                    amax = max(
                        row_partial[unit * NV_PARTIAL_STRIDE + r],
                        row_partial[partner * NV_PARTIAL_STRIDE + r],
                    );
                }
                let byte = nvfp4_block_scale(f32::reinterpret(amax), multiplier);
                let row = row0 + r;
                if writes_scale {
                    outputs.rowwise_scales[scale_index(row, col0 / 16, row_scale_cols, swizzled)] =
                        u8::cast_from(byte);
                }
                let enc = nvfp4_element_scale(byte, s_dec);
                let w = input[(row * cols + col0) / 8];
                #[unroll]
                for j in 0..8usize {
                    v[j] = half_of_word(w[j / 2], j % 2 == 1, kind);
                }
                if has_nan {
                    clear_nans(&mut v, 0usize, 8usize);
                }
                outputs.rowwise[(row * cols + col0) / 8] = encode_word8(
                    &v,
                    0usize,
                    enc,
                    config.stochastic,
                    key,
                    u32::cast_from((row - g_start) * cols + col0),
                    true,
                );
            }
        }
    }

    // 3. Columnwise `[K, M/2]`: each of the unit's 8 columns is one 16-row block (RHT'd when
    //    asked), cleared of NaNs by `nan_free_amax` (the transform spreads an input NaN over
    //    its block and makes NaNs of opposite infinities), encoded to 8 bytes.
    if comptime![with_columnwise] {
        if active && in_group {
            let s_enc = nvfp4_global_encode_scale(f32::reinterpret(columnwise_amax[g]));
            let s_dec = 1.0f32 / s_enc;
            let multiplier = s_enc * 0.16666667f32;
            let local_row0 = row0 - g_start;
            let col_scale_cols = (g_rows / 16 + 3) / 4 * 4;
            let group_scales = (g_start / 16) * ((cols + 127) / 128 * 128);
            let key = keys[2 * g + 1];
            #[unroll(config.unroll)]
            for j in 0..8usize {
                #[unroll]
                for r in 0..16usize {
                    v[r] = half_of_word(words[r * 4 + j / 2], j % 2 == 1, kind);
                }
                if comptime![config.rht] {
                    rht16(&mut v, 0usize, 1usize, kind);
                }
                let block_amax = nan_free_amax(&mut v, 0usize, 16usize);
                let amax = if comptime![block_2d] {
                    tile_amax
                } else {
                    block_amax
                };
                let byte = nvfp4_block_scale(f32::reinterpret(amax), multiplier);
                let col = col0 + j;
                outputs.columnwise_scales
                    [group_scales + scale_index(col, local_row0 / 16, col_scale_cols, swizzled)] =
                    u8::cast_from(byte);
                let enc = nvfp4_element_scale(byte, s_dec);
                let first = col * g_rows + local_row0;
                let mut packed = Vector::<u32, Const<2>>::empty();
                packed[0] = encode_word8(
                    &v,
                    0usize,
                    enc,
                    config.stochastic,
                    key,
                    u32::cast_from(first),
                    true,
                );
                packed[1] = encode_word8(
                    &v,
                    8usize,
                    enc,
                    config.stochastic,
                    key,
                    u32::cast_from(first + 8),
                    true,
                );
                outputs.columnwise[(g_start * cols + first) / 16] = packed;
            }
        }
    }
}
