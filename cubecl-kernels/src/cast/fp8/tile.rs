//! `fp8_cast_kernel`, the FP8 per-tensor cast for every case (with or without an activation
//! prologue): 256 units of 4 rows x 8 columns per 32 x 256 tile.

use cubecl::prelude::*;

use crate::cast::codec::{encode_fp8_by, Fp8Encoder};
use crate::cast::fp8::{
    FP8_ROWS_PER_UNIT, FP8_ROW_GROUPS, FP8_STRIPS, FP8_TILE_COLS, FP8_TILE_ROWS, FP8_UNITS,
    Fp8CastConfig, Fp8Prologue,
};
use crate::cast::fp8::group_scale::{record_group_amax, tile_group_and_scale, write_scale_invs};
use crate::norm_act::act_fn::{act_value, gate_value};
use crate::util::elements::{abs_bits_for_amax, load_chunk, ElemKind};
use crate::util::pairs::round_to_by;

/// Quantizes a tile of 32 rows x 256 columns. A grouped tile lies in one group (groups are
/// multiples of 32 rows); a tile past the last group (the zero tail) writes rowwise codes only.
#[cube(launch_unchecked)]
pub fn fp8_cast_kernel<N: Size>(
    input: &Array<Vector<u32, N>>,
    scale_source: &Array<u32>,
    group_start: &Array<u32>,
    group_rows: &Array<u32>,
    row_index: &Array<u32>,
    rowwise: &mut Array<u32>,
    columnwise: &mut Array<u32>,
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
    alpha: f32,
    limit: f32,
    offset: f32,
    #[comptime] config: Fp8CastConfig,
) {
    let unit = UNIT_POS as usize;
    // With a columnwise copy, row groups vary fastest within a warp (its transposed stores along M
    // then coalesce); rowwise only, strips do (a warp's loads cover 512 contiguous bytes of a row
    // instead of 64 bytes of eight rows, and its stores 256).
    let mut group = unit / FP8_STRIPS;
    let mut strip = unit % FP8_STRIPS;
    if comptime![config.columnwise] {
        group = unit % FP8_ROW_GROUPS;
        strip = unit / FP8_ROW_GROUPS;
    }
    let tile_row0 = CUBE_POS_Y as usize * FP8_TILE_ROWS;
    let row0 = tile_row0 + group * FP8_ROWS_PER_UNIT;
    let col0 = CUBE_POS_X as usize * FP8_TILE_COLS + strip * 8;
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
        FP8_UNITS,
    );

    let mut local_amax = 0u32;
    if active {
        let mut values = Array::<f32>::new(32usize);
        #[unroll]
        for i in 0..4usize {
            if comptime![config.gathered] {
                let src = usize::cast_from(row_index[row0 + i]);
                if src < src_rows {
                    load_chunk::<N>(input, src * cols + col0, &mut values, i * 8, config.kind);
                } else {
                    #[unroll]
                    for j in 0..8usize {
                        values[i * 8 + j] = 0.0f32;
                    }
                }
            } else if comptime![config.prologue.is_none()] {
                load_chunk::<N>(
                    input,
                    (row0 + i) * cols + col0,
                    &mut values,
                    i * 8,
                    config.kind,
                );
            }
        }
        if comptime![config.prologue.is_some()] {
            activated_chunks::<N>(
                input,
                row0,
                col0,
                cols,
                &mut values,
                alpha,
                limit,
                offset,
                comptime![config.prologue.unwrap()],
                config.kind,
                config.encoder,
            );
        }
        let mut codes = Array::<u32>::new(32usize);
        #[unroll]
        for i in 0..32usize {
            if comptime![config.record_amax] {
                let a = abs_bits_for_amax(values[i]);
                if a > local_amax {
                    local_amax = a;
                }
            }
            codes[i] = encode_fp8_by(values[i] * scale, config.fp8, config.encoder);
        }
        if comptime![config.rowwise] {
            #[unroll]
            for i in 0..4usize {
                let word = ((row0 + i) * cols + col0) / 4;
                rowwise[word] = codes[i * 8]
                    | (codes[i * 8 + 1] << 8u32)
                    | (codes[i * 8 + 2] << 16u32)
                    | (codes[i * 8 + 3] << 24u32);
                rowwise[word + 1] = codes[i * 8 + 4]
                    | (codes[i * 8 + 5] << 8u32)
                    | (codes[i * 8 + 6] << 16u32)
                    | (codes[i * 8 + 7] << 24u32);
            }
        }
        if comptime![config.columnwise] {
            if in_group {
                #[unroll]
                for j in 0..8usize {
                    let word =
                        (g_start * cols + (col0 + j) * g_rows + (row0 - g_start)) / 4;
                    columnwise[word] = codes[j]
                        | (codes[8 + j] << 8u32)
                        | (codes[16 + j] << 16u32)
                        | (codes[24 + j] << 24u32);
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
        FP8_UNITS,
    );
    if CUBE_POS == 0 {
        write_scale_invs(scale, scale_source, scale_inv_out, groups, scale_first, scale_stride, config, FP8_UNITS);
    }
}

/// The 4 x 8 values of a unit (rows `row0..+4`, columns `col0..+8` of the output) from `h`:
/// `act(h)`, times `gate(h[:, F + col])` when gated, rounded to `kind` as the activation kernel
/// stores them (by the same `encoder`).
#[cube]
#[allow(clippy::too_many_arguments)]
fn activated_chunks<N: Size>(
    input: &Array<Vector<u32, N>>,
    row0: usize,
    col0: usize,
    cols: usize,
    values: &mut Array<f32>,
    alpha: f32,
    limit: f32,
    offset: f32,
    #[comptime] prologue: Fp8Prologue,
    #[comptime] kind: ElemKind,
    #[comptime] encoder: Fp8Encoder,
) {
    let h_cols = if comptime![prologue.gated] { 2 * cols } else { cols };
    let mut gates = Array::<f32>::new(8usize);
    #[unroll]
    for i in 0..4usize {
        load_chunk::<N>(input, (row0 + i) * h_cols + col0, values, i * 8, kind);
        if comptime![prologue.gated] {
            load_chunk::<N>(input, (row0 + i) * h_cols + cols + col0, &mut gates, 0usize, kind);
        }
        #[unroll]
        for j in 0..8usize {
            let mut y = act_value(values[i * 8 + j], alpha, limit, prologue.act);
            if comptime![prologue.gated] {
                y *= gate_value(gates[j], limit, offset, prologue.clamped_gate);
            }
            values[i * 8 + j] = round_to_by(y, kind, encoder);
        }
    }
}
