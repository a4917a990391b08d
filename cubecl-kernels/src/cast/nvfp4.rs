//! NVFP4: E2M1 codes with E4M3 scales per 1x16 block (or 16x16 tile) under an f32 global scale,
//! rowwise `[M, K/2]` and transposed columnwise `[K, M/2]` from one read, optional random Hadamard
//! transform on the columnwise copy and stochastic rounding. The global amaxes come from the amax
//! pass (`amax.rs`). Host reference: `burn_lowp::format::nvfp4`.
//!
//! Three kernels, chosen by the launcher (`launch::quantize_nvfp4`), all giving the same bytes:
//! - `nvfp4_kernel`: a cube of 256 units stages a 64 x 64 tile in shared memory as f32; then
//!   every unit quantizes one rowwise block (16 columns of a row) and one columnwise block (16
//!   rows of a column, where the RHT runs), each from 16 registers. f32 inputs and stochastic
//!   rounding with the columnwise copy.
//! - `nvfp4_rowwise_kernel`: 1D rowwise-only casts, one unit per two blocks, no shared memory.
//! - `nvfp4_strip_kernel`: the other 16-bit cases, one unit per 16 rows x 8 columns.
//!
//! The element work bounds NVFP4 on Hopper (no E2M1 conversion instruction): the two newer
//! kernels take the branch-free `encode_e2m1_not_nan` and the two-instruction `nan_free_amax`.

use crate::cast::amax::{amax, amax_with_rht, group_amax};
use crate::cast::codec::{encode_e2m1, encode_e2m1_not_nan};
use crate::cast::flags::{COLUMNWISE, ROWWISE, SWIZZLED};
use crate::cast::hadamard::rht16;
use crate::cast::kernel_choice::{tile_kernels_forced, unroll};
use crate::cast::output::{scale_bytes, DirectionOutput, Directions, QuantizeOutput};
use crate::cast::random::random_word;
use crate::cast::scale::{nvfp4_block_scale, nvfp4_element_scale, nvfp4_global_encode_scale};
use crate::cast::swizzle::scale_index;
use crate::grouped::group_layout::{group_args, group_of_row, require_grouped_rows, RowGroups};
use crate::util::buffers::{arg, dummy, filled};
use crate::util::elements::{abs_bits_for_amax, half_of_word, load_chunk, ElemKind};
use crate::util::error::{require, KernelError};
use crate::util::grid::{ceil_div, linear_cubes, round_up};
use crate::util::matrix::{INPUT_VECTOR, InputMatrix};
use cubecl::prelude::*;

/// A cube stages a 64 x 64 tile in shared memory.
pub const NV_TILE: usize = 64;
pub const NV_UNITS: usize = 256;
/// Shared-memory row stride (one padding column keeps column reads conflict-free).
const NV_STRIDE: usize = NV_TILE + 1;
/// 16-element blocks along one tile side.
const NV_BLOCKS: usize = NV_TILE / 16;

#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub struct Nvfp4KernelConfig {
    pub kind: ElemKind,
    pub block_2d: bool,
    pub rht: bool,
    /// Rows form groups (multiples of 64 rows), each with its own global amaxes and random
    /// streams (keys), and its own transposed columnwise block: codes `[cols, rows_g / 2]` at
    /// byte `start_g * cols / 2`, scales `[roundup(cols, 128), rows_g / 16]` at
    /// `start_g / 16` scale columns' worth; stochastic rounding counts elements within the group.
    pub grouped: bool,
    /// Stochastic rounding (the `STOCHASTIC` flag as a compile-time choice, so that the
    /// round-to-nearest kernels carry no stochastic-rounding code: a rarely taken branch per
    /// element still filled the instruction cache).
    pub stochastic: bool,
    /// Fully unroll `nvfp4_strip_kernel`'s per-row and per-column loops (fast code; slow to
    /// compile on lavapipe). `nvfp4_kernel` ignores it.
    pub unroll: bool,
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
        code = encode_e2m1_not_nan(select(x < 0.0f32, -q, q));
    }
    code
}

/// Encodes the 8 values `v[offset..offset + 8]` with multiplier `enc` into one word of packed
/// E2M1 codes (element i in bits 4i..4i+4). Element `i`'s random bits are byte `i % 4` of draw
/// `first_index / 4 + i / 4`, as the host reference's `random_byte(key, first_index + i)`
/// (`burn_lowp::format::random`) takes them, so `first_index` must be a multiple of 4 (every
/// caller's is a multiple of 8): each draw is computed once for its four elements instead of
/// once per element. `nan_free`: the values hold no NaN (the caller replaced
/// them by +0), so round-to-nearest takes `encode_e2m1_not_nan`.
#[cube]
fn encode_word8(
    v: &Array<f32>,
    offset: usize,
    enc: f32,
    #[comptime] stochastic: bool,
    key: u32,
    first_index: u32,
    #[comptime] nan_free: bool,
) -> u32 {
    let mut word = 0u32;
    #[unroll]
    for quad in 0..2usize {
        let mut draw = 0u32;
        if comptime![stochastic] {
            draw = random_word(key, first_index / 4u32 + comptime![quad as u32]);
        }
        #[unroll]
        for b in 0..4usize {
            let i = comptime![quad * 4 + b];
            let x = v[offset + i] * enc;
            let code = if comptime![stochastic] {
                stochastic_round_e2m1(x, (draw >> comptime![8 * b as u32]) & 0xFFu32)
            } else if comptime![nan_free] {
                encode_e2m1_not_nan(x)
            } else {
                encode_e2m1(x)
            };
            word |= code << comptime![4 * i as u32];
        }
    }
    word
}

/// Encodes 16 values `v[0..16]` into two words (see `encode_word8`).
#[cube]
fn encode_block16(
    v: &Array<f32>,
    enc: f32,
    #[comptime] stochastic: bool,
    key: u32,
    first_index: u32,
) -> (u32, u32) {
    (
        encode_word8(v, 0usize, enc, stochastic, key, first_index, false),
        encode_word8(v, 8usize, enc, stochastic, key, first_index + 8u32, false),
    )
}

/// The NaN-skipping amax (as bits) of `v[offset..offset + n]`, leaving the values NaN-free for
/// `encode_e2m1_not_nan`: an integer max over the sign-cleared bits, and only where that finds a
/// NaN (bits above +inf; rare) the NaNs are replaced by +0, which encodes to NaN's code 0 and
/// which the amax skips, and the max is taken again. `block_amax16` spends four ALU
/// instructions an element on NaN checks; this spends two.
#[cube]
fn nan_free_amax(v: &mut Array<f32>, offset: usize, #[comptime] n: usize) -> u32 {
    let mut m = 0u32;
    #[unroll]
    for i in 0..n {
        m = max(m, u32::reinterpret(v[offset + i]) & 0x7FFF_FFFFu32);
    }
    if m > 0x7F80_0000u32 {
        m = 0u32;
        #[unroll]
        for i in 0..n {
            m = max(m, abs_bits_for_amax(v[offset + i]));
        }
        clear_nans(v, offset, n);
    }
    m
}

/// Replaces the NaNs of `v[offset..offset + n]` by +0 (their code, 0, is NaN's).
#[cube]
fn clear_nans(v: &mut Array<f32>, offset: usize, #[comptime] n: usize) {
    #[unroll]
    for i in 0..n {
        let x = v[offset + i];
        v[offset + i] = select(x.is_nan(), 0.0f32, x);
    }
}

#[cube]
fn block_amax16(v: &Array<f32>) -> u32 {
    let mut m = 0u32;
    #[unroll]
    for i in 0..16usize {
        let a = abs_bits_for_amax(v[i]);
        m = select(a > m, a, m);
    }
    m
}

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
    rowwise: &mut Array<u32>,
    rowwise_scales: &mut Array<u8>,
    columnwise: &mut Array<u32>,
    columnwise_scales: &mut Array<u8>,
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
        rowwise_scales[scale_index(row, col0 / 16, row_scale_cols, swizzled)] = u8::cast_from(byte);
        let enc = nvfp4_element_scale(byte, s_dec);
        let (low, high) = encode_block16(
            &v,
            enc,
            config.stochastic,
            rowwise_key,
            u32::cast_from((row - g_start) * cols + col0),
        );
        let word = (row * cols + col0) / 8;
        rowwise[word] = low;
        rowwise[word + 1] = high;
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
            columnwise_scales
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
            columnwise[word] = low;
            columnwise[word + 1] = high;
        }
    }
}

/// Elements per unit of `nvfp4_rowwise_kernel`: two 1x16 blocks, whose 32 codes are one 16-byte
/// store.
pub const NV_ROWWISE_ELEMENTS: usize = 32;

/// Rowwise-only NVFP4 with 1x16 blocks (not grouped; `cols % 32 == 0`): one unit per two blocks
/// of a row, amaxes in registers, no shared memory and no cube barrier. A warp reads 32
/// consecutive 64-byte pieces of a row (2 KiB of bf16) and writes 512 contiguous code bytes as
/// 16-byte vectors. Same codes and scales as `nvfp4_kernel`, which stages a 64x64 tile in shared
/// memory for every case; the launcher picks this kernel for the forward activation's cast.
/// The element work is what bounds NVFP4 (Nsight Compute: the ALU pipe, not DRAM), hence
/// `nan_free_amax` and `encode_e2m1_not_nan`.
#[cube(launch_unchecked)]
pub fn nvfp4_rowwise_kernel<N: Size>(
    input: &Array<Vector<u32, N>>,
    amax: &Array<u32>,
    keys: &Array<u32>,
    codes: &mut Array<Vector<u32, N>>,
    scales: &mut Array<u8>,
    rows: usize,
    cols: usize,
    flags: u32,
    #[comptime] config: Nvfp4KernelConfig,
) {
    let pieces_per_row = cols / NV_ROWWISE_ELEMENTS;
    let piece = ABSOLUTE_POS;
    if piece < rows * pieces_per_row {
        let row = piece / pieces_per_row;
        let col0 = (piece % pieces_per_row) * NV_ROWWISE_ELEMENTS;
        let start = row * cols + col0;
        let swizzled = (flags & SWIZZLED) != 0u32;
        let mut v = Array::<f32>::new(32usize);
        #[unroll]
        for i in 0..4usize {
            load_chunk::<N>(input, start + i * 8, &mut v, i * 8, config.kind);
        }
        let s_enc = nvfp4_global_encode_scale(f32::reinterpret(amax[0]));
        let s_dec = 1.0f32 / s_enc;
        let multiplier = s_enc * 0.16666667f32; // S_enc * (1/6)
        let row_scale_cols = (cols / 16 + 3) / 4 * 4;
        let mut packed = Vector::<u32, N>::empty();
        #[unroll]
        for b in 0..2usize {
            let m = nan_free_amax(&mut v, comptime![b * 16], 16usize);
            let byte = nvfp4_block_scale(f32::reinterpret(m), multiplier);
            scales[scale_index(row, col0 / 16 + b, row_scale_cols, swizzled)] = u8::cast_from(byte);
            let enc = nvfp4_element_scale(byte, s_dec);
            #[unroll]
            for h in 0..2usize {
                packed[b * 2 + h] = encode_word8(
                    &v,
                    comptime![b * 16 + h * 8],
                    enc,
                    config.stochastic,
                    keys[0],
                    u32::cast_from(start + comptime![b * 16 + h * 8]),
                    true,
                );
            }
        }
        codes[start / NV_ROWWISE_ELEMENTS] = packed;
    }
}

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
    rowwise: &mut Array<u32>,
    rowwise_scales: &mut Array<u8>,
    columnwise: &mut Array<Vector<u32, Const<2>>>,
    columnwise_scales: &mut Array<u8>,
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
                    rowwise_scales[scale_index(row, col0 / 16, row_scale_cols, swizzled)] =
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
                rowwise[(row * cols + col0) / 8] = encode_word8(
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
                columnwise_scales
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
                columnwise[(g_start * cols + first) / 16] = packed;
            }
        }
    }
}

const NV_ROWWISE_UNITS: usize = 256;

/// Byte sizes of NVFP4 compact scales: rowwise `[roundup(M,128), roundup(K/16,4)]`, columnwise
/// `[roundup(K,128), roundup(M/16,4)]`.
pub fn nvfp4_scale_shapes(rows: usize, cols: usize) -> ([usize; 2], [usize; 2]) {
    (
        [round_up(rows, 128), round_up(cols / 16, 4)],
        [round_up(cols, 128), round_up(rows / 16, 4)],
    )
}

/// NVFP4 options.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Nvfp4Options {
    pub block_2d: bool,
    pub rht: bool,
    /// Stochastic rounding keys (rowwise, columnwise) from
    /// `burn_lowp::format::random::stream_key`: one pair, or one per group when grouped.
    pub stochastic_keys: Option<Vec<(u32, u32)>>,
}

/// NVFP4: amax pass (with the post-RHT amax when `rht`), then one quantize launch. Needs
/// `M % 16 == 0` and `K % 16 == 0`; 2D blocks and RHT cannot be combined. With `groups`, each
/// group gets its own global amaxes and random streams (no swizzled scales).
///
/// Kernels: `nvfp4_rowwise_kernel` for 1D rowwise-only casts (`K % 32 == 0`, not grouped),
/// `nvfp4_strip_kernel` for the other 16-bit cases without stochastic rounding,
/// `nvfp4_kernel` (64x64 tiles staged in shared memory) for the rest (f32 inputs, stochastic
/// rounding with the columnwise copy); all give the same bytes.
pub fn quantize_nvfp4<R: Runtime>(
    client: &ComputeClient<R>,
    x: InputMatrix,
    options: &Nvfp4Options,
    directions: Directions,
    swizzled: bool,
    groups: Option<RowGroups>,
) -> Result<QuantizeOutput, KernelError> {
    x.require_blocks(16, 16, "NVFP4")?;
    require_grouped_rows(&x, groups)?;
    require(
        !(options.block_2d && options.rht),
        "16x16 blocks with RHT",
        "NVFP4 applies RHT to 1x16 activations and gradients only",
    )?;
    require(
        !(swizzled && groups.is_some()),
        "swizzled scales of a grouped matrix",
        "grouped NVFP4 writes compact scales",
    )?;
    let count = groups.map_or(1, |g| g.count);
    if let Some(keys) = &options.stochastic_keys {
        require(
            keys.len() == count,
            format!("{} stochastic-rounding key pairs", keys.len()),
            format!("one per group ({count})"),
        )?;
    }
    let post_rht = options.rht && directions.columnwise;
    let (rowwise_amax, columnwise_amax) = match (groups, post_rht) {
        (Some(g), true) => group_amax(client, x, g, true)?,
        (Some(g), false) => {
            let a = group_amax(client, x, g, false)?.0;
            (a.clone(), a)
        }
        (None, true) => amax_with_rht(client, x)?,
        (None, false) => {
            let a = amax(client, x)?;
            (a.clone(), a)
        }
    };
    let n = x.rows * x.cols;
    let (row_shape, col_shape) = nvfp4_scale_shapes(x.rows, x.cols);
    // A grouped matrix's compact scales keep their fill.
    let whole = groups.is_none();
    let rowwise = if directions.rowwise {
        client.empty(n / 2)
    } else {
        dummy(client)
    };
    let rowwise_scales = if directions.rowwise {
        scale_bytes(client, row_shape, whole.then_some([x.rows, x.cols / 16]))
    } else {
        dummy(client)
    };
    let columnwise = if directions.columnwise {
        client.empty(n / 2)
    } else {
        dummy(client)
    };
    let columnwise_scales = if directions.columnwise {
        scale_bytes(client, col_shape, whole.then_some([x.cols, x.rows / 16]))
    } else {
        dummy(client)
    };
    // Without stochastic rounding the kernel reads no key: zeroed words from the arena, no upload.
    let keys = match &options.stochastic_keys {
        Some(keys) => {
            let key_words: Vec<u32> = keys.iter().flat_map(|&(r, c)| [r, c]).collect();
            client.create_from_slice(u32::as_bytes(&key_words))
        }
        None => filled(client, 2 * count, 0),
    };
    let config = Nvfp4KernelConfig {
        kind: x.kind,
        block_2d: options.block_2d,
        rht: options.rht,
        grouped: groups.is_some(),
        stochastic: options.stochastic_keys.is_some(),
        unroll: unroll(client),
    };
    let flags = directions.flags() | if swizzled { SWIZZLED } else { 0 };
    let (group_start, group_rows, count) = group_args(client, groups);
    let rowwise_only_1d = directions.rowwise
        && !directions.columnwise
        && !options.block_2d
        && groups.is_none()
        && x.cols % NV_ROWWISE_ELEMENTS == 0;
    // Stochastic rounding with the columnwise copy stays on the tile kernel: the strip kernel
    // holds 217 registers there and took 709 / 1607 us (columnwise / both, 16384x8192 bf16,
    // H100) against the tile kernel's 574 / 868 us (`benches/results/nvfp4-h100/call4`).
    let stochastic_columnwise = options.stochastic_keys.is_some() && directions.columnwise;
    if tile_kernels_forced()
        || (x.kind == ElemKind::F32 && !rowwise_only_1d)
        || stochastic_columnwise
    {
        unsafe {
            nvfp4_kernel::launch_unchecked::<R>(
                client,
                CubeCount::Static(
                    ceil_div(x.cols, NV_TILE) as u32,
                    ceil_div(x.rows, NV_TILE) as u32,
                    1,
                ),
                CubeDim::new_1d(NV_UNITS as u32),
                INPUT_VECTOR,
                x.arg(),
                arg(&rowwise_amax, count),
                arg(&columnwise_amax, count),
                arg(&keys, 2 * count),
                group_start,
                group_rows,
                arg(&rowwise, n / 8),
                arg(&rowwise_scales, row_shape[0] * row_shape[1]),
                arg(&columnwise, n / 8),
                arg(&columnwise_scales, col_shape[0] * col_shape[1]),
                x.rows,
                x.cols,
                count,
                flags,
                config,
            )
        };
    } else if rowwise_only_1d {
        // The forward activation's cast: one unit per two 1x16 blocks, no shared memory.
        unsafe {
            nvfp4_rowwise_kernel::launch_unchecked::<R>(
                client,
                linear_cubes(client, (n / NV_ROWWISE_ELEMENTS).div_ceil(NV_ROWWISE_UNITS)),
                CubeDim::new_1d(NV_ROWWISE_UNITS as u32),
                INPUT_VECTOR,
                x.arg(),
                arg(&rowwise_amax, 1),
                arg(&keys, 2),
                arg(&rowwise, n / 8),
                arg(&rowwise_scales, row_shape[0] * row_shape[1]),
                x.rows,
                x.cols,
                flags,
                config,
            )
        };
    } else {
        // 16-bit input with the columnwise copy, 2D blocks or row groups: one unit per 16x8 strip.
        unsafe {
            nvfp4_strip_kernel::launch_unchecked::<R>(
                client,
                CubeCount::Static(
                    ceil_div(x.cols, NV_STRIP_TILE_COLS) as u32,
                    ceil_div(x.rows, NV_STRIP_TILE_ROWS) as u32,
                    1,
                ),
                CubeDim::new_1d(NV_STRIP_UNITS as u32),
                INPUT_VECTOR,
                x.arg(),
                arg(&rowwise_amax, count),
                arg(&columnwise_amax, count),
                arg(&keys, 2 * count),
                group_start,
                group_rows,
                arg(&rowwise, n / 8),
                arg(&rowwise_scales, row_shape[0] * row_shape[1]),
                arg(&columnwise, n / 8),
                arg(&columnwise_scales, col_shape[0] * col_shape[1]),
                x.rows,
                x.cols,
                count,
                flags,
                config,
                directions.rowwise,
                directions.columnwise,
            )
        };
    }
    Ok(QuantizeOutput::kept(
        directions,
        DirectionOutput {
            codes: rowwise,
            scales: rowwise_scales,
            amax: Some(rowwise_amax),
        },
        DirectionOutput {
            codes: columnwise,
            scales: columnwise_scales,
            amax: Some(columnwise_amax),
        },
    ))
}
