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
//!
//! This module holds the kernels' configuration and tile, and the launchers; `group_scale` the
//! per-group steps both kernels share.

use crate::cast::amax::{amax, group_amax_gathered};
use crate::cast::codec::{Fp8Encoder, Fp8Kind};
use crate::cast::kernel_choice::fp8_encoder;
use crate::cast::output::{DirectionOutput, Directions, QuantizeOutput};
use crate::cast::scale::ScaleRule;
use crate::grouped::group_layout::{group_args, require_grouped_rows, RowGroups};
use crate::grouped::row_gather::{gather_args, RowGather};
use crate::norm_act::act_fn::{ActFn, ActivationParams};
use crate::norm_act::activation::{activation_amax, ActivationConfig};
use crate::util::buffers::{arg, dummy, filled};
use crate::util::elements::ElemKind;
use crate::util::error::{require, KernelError};
use crate::util::grid::ceil_div;
use crate::util::matrix::{INPUT_VECTOR, InputMatrix, WordMatrix};

use cubecl::prelude::*;
use cubecl::server::Handle;

pub mod group_scale;
pub mod tile;
pub mod transposed;

use tile::fp8_cast_kernel;
use transposed::{fp8_cast_transposed_kernel, FP8_TRANSPOSED_UNITS};

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
