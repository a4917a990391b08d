//! FP8 per-tensor quantization (current or delayed scaling): rowwise codes `[M, K]` and, in the
//! same launch, the physically transposed columnwise codes `[K, M]` (Hopper's FP8 GEMM is TN-only).
//! Host reference: `burn_lowp::format::fp8_tensor`.
//!
//! Tiling: a cube covers 32 rows x 256 columns, by one of two kernels (the launcher picks):
//! - `fp8_cast_transposed_kernel`, 16-bit inputs writing both copies (no prologue): 64 units of
//!   16 rows x 8 columns, each column's 16 codes one 16-byte store;
//! - `fp8_cast_kernel`, everything else: 256 units of 4 rows x 8 columns, 2 rowwise words per row
//!   and one columnwise word (4 codes along M) per column. With a columnwise copy, units are
//!   numbered row-group first, so the 8 units of a column write one contiguous 32-byte run of
//!   the transposed output; rowwise only, strip first, so a warp reads and writes along rows.
//!
//! With a prologue (`Fp8Prologue`) the cast reads a LayerNormMLP's fc1 output `h` and quantizes
//! the activation `act(h)` (gated: `act(h[:, :F]) · gate(h[:, F:])`) in the same pass, each value
//! rounded to h's dtype first as `activation_forward` stores it: the codes of the activation kernel
//! followed by the cast, without the activation's output in memory.
//!
//! Grouped (MoE) mode gives each group of rows its own scale and its own transposed columnwise
//! block, exactly as quantizing each group's slice on its own would; with a shared scale every
//! group takes one scale (the largest group amax's, or the smallest delayed scale), folded by
//! every cube from the per-group sources in the same launch.

use crate::cast::amax::{amax, group_amax_gathered};
use crate::cast::codec::{encode_fp8_by, Fp8Encoder, Fp8Kind};
use crate::cast::kernel_choice::fp8_encoder;
use crate::cast::output::{DirectionOutput, Directions, QuantizeOutput};
use crate::cast::scale::{scale_from_amax, ScaleRule};
use crate::grouped::group_layout::{group_args, group_of_row, require_grouped_rows, RowGroups};
use crate::grouped::row_gather::{gather_args, RowGather};
use crate::norm_act::activation::{
    act_value, activation_amax, gate_value, ActFn, ActivationConfig, ActivationParams,
};
use crate::util::buffers::{arg, dummy, filled};
use crate::util::elements::{abs_bits_for_amax, load_chunk, ElemKind};
use crate::util::error::{require, KernelError};
use crate::util::grid::ceil_div;
use crate::util::matrix::{INPUT_VECTOR, InputMatrix, WordMatrix};
use crate::util::pairs::{round_to_by, vector_element};
use crate::util::reduce::{cube_max_f32, cube_max_into};
use cubecl::prelude::*;
use cubecl::server::Handle;

pub const FP8_ROWS_PER_UNIT: usize = 4;
pub const FP8_ROW_GROUPS: usize = 8;
pub const FP8_STRIPS: usize = 32;
pub const FP8_UNITS: usize = FP8_ROW_GROUPS * FP8_STRIPS;
pub const FP8_TILE_ROWS: usize = FP8_ROWS_PER_UNIT * FP8_ROW_GROUPS;
pub const FP8_TILE_COLS: usize = 8 * FP8_STRIPS;

#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub struct Fp8CastConfig {
    pub kind: ElemKind,
    pub fp8: Fp8Kind,
    /// Group g's scale source, `scale_source[scale_first + g * scale_stride]`, is its amax
    /// (current scaling) rather than its scale (delayed: read from the module's scales).
    pub from_amax: bool,
    pub rule: ScaleRule,
    pub rowwise: bool,
    pub columnwise: bool,
    /// Record each group's amax into `amax_out[g]` (delayed scaling history).
    pub record_amax: bool,
    /// Delayed scaling: also fold group g's amax into `amax_history[history_first + g *
    /// history_stride]`, row 0 of the module's amax history, so that the history needs no launch
    /// of its own per cast (an atomic max: micro-batches keep the largest, as TE's record does).
    pub record_history: bool,
    /// Rows form groups (`group_start`, `group_rows`), each with its own scale, its columnwise
    /// copy transposed on its own (`[cols, rows_g]` at byte `start_g * cols`). Otherwise the whole
    /// matrix is one group and the arrays are not read.
    pub grouped: bool,
    /// Grouped: one scale for every group, made from all groups' sources (the largest amax, or
    /// the smallest delayed scale), so that a grouped GEMM can apply it as one per-tensor scale.
    pub shared_scale: bool,
    /// Row r of the matrix is row `row_index[r]` of `input` (`[src_rows, cols]`), or a zero row
    /// where that is `src_rows` or more: the grouped cast reads a packed token batch through its
    /// aligned layout's row map, so the padded copy is never written. Otherwise row r is row r.
    pub gathered: bool,
    pub encoder: Fp8Encoder,
    /// The activation applied to what is read (ungrouped, not gathered): the input is `h`, with
    /// twice the output's columns when gated.
    pub prologue: Option<Fp8Prologue>,
}

/// The activation an FP8 cast applies to its input (see the module's docs); `alpha`, `limit` and
/// `offset` are the kernel's runtime arguments, as `activation_forward_kernel`'s.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub struct Fp8Prologue {
    pub act: ActFn,
    pub gated: bool,
    pub clamped_gate: bool,
}

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

/// The group of the tile starting at row `tile_row0` as `(g, first row, rows)`, whether the tile
/// lies inside it (a tile past the last group, the zero tail, has no columnwise place), and the
/// scale its codes take (`group_scale`). Uniform per cube: a tile lies in one group (groups are
/// multiples of 32 rows).
#[cube]
#[allow(clippy::too_many_arguments)]
fn tile_group_and_scale(
    scale_source: &Array<u32>,
    group_start: &Array<u32>,
    group_rows: &Array<u32>,
    rows: usize,
    groups: usize,
    scale_first: usize,
    scale_stride: usize,
    tile_row0: usize,
    #[comptime] config: Fp8CastConfig,
    #[comptime] units: usize,
) -> (usize, usize, usize, bool, f32) {
    let (g, g_start, g_rows) =
        group_of_row(group_start, group_rows, groups, rows, tile_row0, config.grouped);
    let in_group = tile_row0 - g_start < g_rows;
    let scale = group_scale(scale_source, g, groups, scale_first, scale_stride, config, units);
    (g, g_start, g_rows, in_group, scale)
}

/// The scale group `g`'s codes are multiplied by: from its amax (current scaling) or its delayed
/// scale; with a shared scale, from the largest amax or the smallest scale of all groups, folded
/// by the cube (so every unit of the cube must call it).
#[cube]
fn group_scale(
    scale_source: &Array<u32>,
    g: usize,
    groups: usize,
    scale_first: usize,
    scale_stride: usize,
    #[comptime] config: Fp8CastConfig,
    #[comptime] units: usize,
) -> f32 {
    let mut source = f32::reinterpret(scale_source[scale_first + g * scale_stride]);
    if comptime![config.shared_scale] {
        // The largest amax (current) or the smallest scale, as the max of `-scale` (delayed):
        // every unit folds a stride of the groups, the cube reduces.
        let mut key = f32::reinterpret(scale_source[scale_first]);
        if comptime![!config.from_amax] {
            key = -key;
        }
        for e in range_stepped(UNIT_POS as usize, groups, units) {
            let mut k = f32::reinterpret(scale_source[scale_first + e * scale_stride]);
            if comptime![!config.from_amax] {
                k = -k;
            }
            key = select(k > key, k, key);
        }
        let mut folded = SharedMemory::<f32>::new(units);
        source = cube_max_f32(key, &mut folded, units);
        if comptime![!config.from_amax] {
            source = -source;
        }
    }
    if comptime![config.from_amax] {
        scale_from_amax(source, config.rule)
    } else {
        source
    }
}

/// With `record_amax`, the cube's amax of group `g` into `amax_out[g]` (and, with
/// `record_history`, into row 0 of the amax history). Uniform per cube: a cast's cube lies in
/// one group.
#[cube]
#[allow(clippy::too_many_arguments)]
fn record_group_amax(
    local_amax: u32,
    in_group: bool,
    g: usize,
    amax_out: &mut Array<Atomic<u32>>,
    amax_history: &mut Array<Atomic<u32>>,
    history_first: usize,
    history_stride: usize,
    #[comptime] config: Fp8CastConfig,
    #[comptime] units: usize,
) {
    if comptime![config.record_amax] {
        if in_group {
            let mut scratch = SharedMemory::<u32>::new(units);
            cube_max_into(local_amax, &mut scratch, amax_out, g, units);
            if comptime![config.record_history] {
                if UNIT_POS == 0 {
                    // Unit 0 still sees the cube's maximum in `scratch[0]`.
                    amax_history[history_first + g * history_stride].fetch_max(scratch[0]);
                }
            }
        }
    }
}

/// Every group's `scale_inv`, empty groups included (cube 0 calls it); `scale` is the cube's
/// own, which every group takes with a shared scale.
#[cube]
#[allow(clippy::too_many_arguments)]
fn write_scale_invs(
    scale: f32,
    scale_source: &Array<u32>,
    scale_inv_out: &mut Array<u32>,
    groups: usize,
    scale_first: usize,
    scale_stride: usize,
    #[comptime] config: Fp8CastConfig,
    #[comptime] units: usize,
) {
    for e in range_stepped(UNIT_POS as usize, groups, units) {
        let mut group_scale = scale;
        if comptime![!config.shared_scale] {
            let source = f32::reinterpret(scale_source[scale_first + e * scale_stride]);
            group_scale = if comptime![config.from_amax] {
                scale_from_amax(source, config.rule)
            } else {
                source
            };
        }
        scale_inv_out[e] = u32::reinterpret(1.0f32 / group_scale);
    }
}

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

/// Where an FP8 per-tensor scale comes from.
pub enum TensorScaling<'a> {
    /// Current scaling: an amax pass, then `rule` turns the amax into the scale on the device.
    Current { rule: ScaleRule },
    /// Current scaling whose amax a producer already took (f32 bits, one per group; e.g. the
    /// LayerNormMLP norm and activation kernels fuse it): no amax pass.
    CurrentFromAmax { rule: ScaleRule, amax: &'a Handle },
    /// Delayed scaling: group g's f32 scale is read from the module's scales (`scale`, by
    /// index: no copy of the state per cast); the amax is recorded, and with `history` also
    /// folded into row 0 of the module's amax history in the same launch.
    Delayed {
        scale: StateColumns<'a>,
        history: Option<StateColumns<'a>>,
    },
}

/// Words of a module's f32 delayed-scaling state that a cast reads or writes in place: group g's
/// is word `first + g * stride` of `buffer` (the scales, or row 0 of the amax history). An index,
/// not a view: wgpu binds buffers only at aligned offsets, and a Burn slice at another offset is a
/// copy.
#[derive(Clone, Copy, Debug)]
pub struct StateColumns<'a> {
    pub buffer: &'a Handle,
    pub first: usize,
    pub stride: usize,
}

impl StateColumns<'_> {
    /// Words the buffer must hold for `count` groups.
    fn len(&self, count: usize) -> usize {
        self.first + count.saturating_sub(1) * self.stride + 1
    }
}

/// FP8 per-tensor quantization. Needs `M % 16 == 0` and `K % 16 == 0` (cuBLASLt FP8 alignment).
/// With `groups`, each group gets its own scale (`scale_inv` and amax hold one f32 per group), or
/// with `shared_scale` one scale made from all groups' (the largest amax, the smallest delayed
/// scale), written once per group; the amax stays each group's own.
pub fn quantize_fp8_tensor<R: Runtime>(
    client: &ComputeClient<R>,
    x: InputMatrix,
    fp8: Fp8Kind,
    scaling: TensorScaling,
    directions: Directions,
    groups: Option<RowGroups>,
    shared_scale: bool,
) -> Result<QuantizeOutput, KernelError> {
    quantize_fp8_tensor_gathered(client, x, fp8, scaling, directions, groups, shared_scale, None)
}

/// `quantize_fp8_tensor` of the matrix `x` read through `gather` (`RowGather`; grouped only): the
/// same codes, scales and amaxes as gathering the rows first, in one read of `x` for the amax
/// and one for the cast.
#[allow(clippy::too_many_arguments)]
pub fn quantize_fp8_tensor_gathered<R: Runtime>(
    client: &ComputeClient<R>,
    x: InputMatrix,
    fp8: Fp8Kind,
    scaling: TensorScaling,
    directions: Directions,
    groups: Option<RowGroups>,
    shared_scale: bool,
    gather: Option<RowGather>,
) -> Result<QuantizeOutput, KernelError> {
    fp8_cast(client, x, fp8, scaling, directions, groups, shared_scale, gather, None)
}

/// FP8 per-tensor quantization with a known scale (delayed scaling) of a LayerNormMLP's fc2
/// input straight from fc1's output `h [rows, F']` (`F' = 2F` when gated): the codes, scale and
/// amax of `activation_forward` followed by `quantize_fp8_tensor` on its `[rows, F]` output, in
/// one read of `h` and without that output in memory.
pub fn quantize_fp8_tensor_activated<R: Runtime>(
    client: &ComputeClient<R>,
    h: InputMatrix,
    activation: (Fp8Prologue, ActivationParams),
    fp8: Fp8Kind,
    scale: StateColumns,
    history: Option<StateColumns>,
    directions: Directions,
) -> Result<QuantizeOutput, KernelError> {
    let scaling = TensorScaling::Delayed { scale, history };
    fp8_cast(client, h, fp8, scaling, directions, None, false, None, Some(activation))
}

/// FP8 current scaling of a LayerNormMLP's fc2 input straight from fc1's output `h [rows, F']`:
/// the amax of the activation (`activation_amax`, a pass over `h` that stores nothing), then the
/// cast with the activation as its prologue. The codes, scale and amax of `activation_forward`
/// (with its amax) followed by `quantize_fp8_tensor` from that amax, bit for bit, without the
/// activation's output in memory: `h` is read twice and the activation computed twice, where
/// the unfused pair reads `h`, writes the output and reads it back.
pub fn quantize_fp8_tensor_activated_current<R: Runtime>(
    client: &ComputeClient<R>,
    h: InputMatrix,
    activation: (Fp8Prologue, ActivationParams),
    rule: ScaleRule,
    directions: Directions,
) -> Result<QuantizeOutput, KernelError> {
    let (prologue, params) = activation;
    // The cast's own checks, before the amax pass runs.
    fp8_cast_matrix(h, h.rows, prologue.gated)?;
    let config = ActivationConfig {
        kind: h.kind,
        act: prologue.act,
        gated: prologue.gated,
        clamped_gate: prologue.clamped_gate,
        amax: true,
        dbias: false,
        encoder: fp8_encoder(client),
    };
    let matrix = WordMatrix {
        handle: h.handle,
        rows: h.rows,
        cols: h.cols,
        kind: h.kind,
    };
    let amax = activation_amax(client, matrix, params, config)?;
    let scaling = TensorScaling::CurrentFromAmax { rule, amax: &amax };
    fp8_cast(client, h, rule.fp8, scaling, directions, None, false, None, Some(activation))
}

/// The matrix the FP8 per-tensor cast quantizes: `rows` rows of `x` (the source keeps its own
/// rows for the argument's length); with a gated activation as its prologue, half the source's
/// columns, which must then be even. Its dimensions must be multiples of 16.
fn fp8_cast_matrix(x: InputMatrix, rows: usize, gated: bool) -> Result<InputMatrix, KernelError> {
    require(
        !gated || x.cols % 2 == 0,
        format!("activation input [{}, {}]", x.rows, x.cols),
        "a gated activation's input holds two halves of one width",
    )?;
    let seen = InputMatrix {
        rows,
        cols: if gated { x.cols / 2 } else { x.cols },
        ..x
    };
    seen.require_blocks(16, 16, "FP8 per-tensor kernels")?;
    Ok(seen)
}

/// The FP8 per-tensor cast behind the public launchers: `x` read through `gather`, or with
/// `prologue` the activation of `x` (ungrouped).
#[allow(clippy::too_many_arguments)]
fn fp8_cast<R: Runtime>(
    client: &ComputeClient<R>,
    x: InputMatrix,
    fp8: Fp8Kind,
    scaling: TensorScaling,
    directions: Directions,
    groups: Option<RowGroups>,
    shared_scale: bool,
    gather: Option<RowGather>,
    prologue: Option<(Fp8Prologue, ActivationParams)>,
) -> Result<QuantizeOutput, KernelError> {
    require(
        gather.is_none() || groups.is_some(),
        "a row gather without groups".to_string(),
        "only the grouped FP8 per-tensor cast reads through a row map",
    )?;
    require(
        prologue.is_none() || (groups.is_none() && gather.is_none()),
        "an activation prologue on a grouped cast".to_string(),
        "the FP8 cast applies an activation to a plain matrix only",
    )?;
    let (rows, row_index, src_rows) = gather_args(client, x, gather);
    let gated = prologue.is_some_and(|(p, _)| p.gated);
    let seen = fp8_cast_matrix(x, rows, gated)?;
    require_grouped_rows(&seen, groups)?;
    require(
        !shared_scale || groups.is_some(),
        "shared scale without groups".to_string(),
        "a shared scale is shared by the groups of a grouped matrix",
    )?;
    let count = groups.map_or(1, |g| g.count);
    let history = match &scaling {
        TensorScaling::Delayed { history, .. } => *history,
        _ => None,
    };
    // The scales or amaxes the scale comes from: group g's is word `first + g * stride`.
    let (scale_source, from_amax, rule, amax_out) = match scaling {
        TensorScaling::Current { rule } => {
            let amax = match groups {
                Some(g) => group_amax_gathered(client, x, g, false, gather)?.0,
                None => amax(client, x)?,
            };
            ((amax.clone(), 0, 1), true, rule, amax)
        }
        TensorScaling::CurrentFromAmax { rule, amax } => {
            ((amax.clone(), 0, 1), true, rule, amax.clone())
        }
        TensorScaling::Delayed { scale, .. } => {
            let rule = ScaleRule {
                fp8,
                pow2: false,
                epsilon_bits: 0,
                value_for_inf_bits: f32::MAX.to_bits(),
            };
            let source = (scale.buffer.clone(), scale.first, scale.stride);
            (source, false, rule, filled(client, count, 0))
        }
    };
    let (scale_source, scale_first, scale_stride) = scale_source;
    let n = rows * seen.cols;
    let rowwise = if directions.rowwise {
        client.empty(n)
    } else {
        dummy(client)
    };
    let columnwise = if directions.columnwise {
        client.empty(n)
    } else {
        dummy(client)
    };
    let scale_inv = client.empty(4 * count);
    let config = Fp8CastConfig {
        kind: x.kind,
        fp8,
        from_amax,
        rule,
        rowwise: directions.rowwise,
        columnwise: directions.columnwise,
        record_amax: !from_amax,
        record_history: history.is_some(),
        grouped: groups.is_some(),
        shared_scale,
        gathered: gather.is_some(),
        encoder: fp8_encoder(client),
        prologue: prologue.map(|(p, _)| p),
    };
    let params = prologue.map_or(ActivationParams { alpha: 0.0, limit: 0.0, offset: 0.0 }, |(_, p)| p);
    let (history_row, history_first, history_stride, history_len) = match history {
        Some(h) => (h.buffer.clone(), h.first, h.stride, h.len(count)),
        None => (dummy(client), 0, 0, 1),
    };
    let scale_len = StateColumns { buffer: &scale_source, first: scale_first, stride: scale_stride }.len(count);
    let (group_start, group_rows, count) = group_args(client, groups);
    let cubes = CubeCount::Static(
        ceil_div(seen.cols, FP8_TILE_COLS) as u32,
        ceil_div(rows, FP8_TILE_ROWS) as u32,
        1,
    );
    // Both kernels take the same arguments, the activation's parameters last (the transposed
    // kernel has no prologue, so none).
    macro_rules! launch_cast {
        ($kernel:ident, $units:expr $(, $activation:expr)*) => {
            unsafe {
                $kernel::launch_unchecked::<R>(
                    client,
                    cubes,
                    CubeDim::new_1d($units as u32),
                    INPUT_VECTOR,
                    x.arg(),
                    arg(&scale_source, scale_len),
                    group_start,
                    group_rows,
                    row_index,
                    arg(&rowwise, n / 4),
                    arg(&columnwise, n / 4),
                    arg(&scale_inv, count),
                    arg(&amax_out, count),
                    arg(&history_row, history_len),
                    rows,
                    seen.cols,
                    count,
                    src_rows,
                    scale_first,
                    scale_stride,
                    history_first,
                    history_stride,
                    $($activation,)*
                    config,
                )
            }
        };
    }
    if directions.rowwise && directions.columnwise && x.kind != ElemKind::F32 && prologue.is_none() {
        // 16-bit input, both copies: units shaped for the transposed stores. On an H100 (stop 44,
        // A/B in turns) it wrote both copies of 16384 x 8192 bf16 in 201.9 µs against 208.0
        // (current scaling 293.5 against 306.0), but the columnwise copy alone in 148.3 against
        // 146.0 µs.
        launch_cast!(fp8_cast_transposed_kernel, FP8_TRANSPOSED_UNITS);
    } else {
        launch_cast!(fp8_cast_kernel, FP8_UNITS, params.alpha, params.limit, params.offset);
    }
    let side = |codes: Handle| DirectionOutput {
        codes,
        scales: scale_inv.clone(),
        amax: Some(amax_out.clone()),
    };
    Ok(QuantizeOutput::kept(
        directions,
        side(rowwise),
        side(columnwise),
    ))
}
