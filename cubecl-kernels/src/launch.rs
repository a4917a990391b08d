//! Launch wrappers: validate shapes, allocate outputs, pick cube counts, launch. They take and
//! return CubeCL handles.

use cubecl::prelude::*;
use cubecl::server::Handle;

use crate::cast::amax::{
    amax_kernel, amax_rht_kernel, group_amax_kernel, AMAX_UNITS, GROUP_AMAX_COLS, GROUP_AMAX_ROWS,
};
use crate::util::buffers::{copy_kernel, copy_words_kernel, fill_kernel};
use crate::cast::codec::{ElemKind, Fp8Encoder, Fp8Kind};
use crate::cast::dequantize::{
    dequantize_fp8_grouped_kernel, dequantize_fp8_kernel, dequantize_mxfp8_kernel,
    dequantize_nvfp4_kernel,
};
use crate::cast::flags;
use crate::norm_act::activation::{activation_amax, ActivationConfig, ActivationParams};
use crate::norm_act::norm::WordMatrix;
use crate::cast::fp8::{
    fp8_cast_kernel, fp8_cast_transposed_kernel, Fp8CastConfig, Fp8Prologue, FP8_TILE_COLS, FP8_TILE_ROWS,
    FP8_TRANSPOSED_UNITS, FP8_UNITS,
};
use crate::cast::fp8_block::{
    fp8_block_kernel, fp8_block_transposed_kernel, Fp8BlockKernelConfig, BLOCK_TILE, BLOCK_UNITS,
    TRANSPOSED_UNITS,
};
use crate::cast::mxfp8::{
    mxfp8_kernel, mxfp8_rowwise_kernel, mxfp8_strip_kernel, Mxfp8Config, MX_STRIP_TILE_COLS,
    MX_STRIP_UNITS, MX_TILE_COLS, MX_TILE_ROWS, MX_UNITS,
};
use crate::cast::nvfp4::{
    nvfp4_kernel, nvfp4_rowwise_kernel, nvfp4_strip_kernel, Nvfp4KernelConfig,
    NV_ROWWISE_ELEMENTS, NV_STRIP_TILE_COLS, NV_STRIP_TILE_ROWS, NV_STRIP_UNITS, NV_TILE, NV_UNITS,
};
use crate::cast::scale::ScaleRule;
use crate::cast::swizzle::{swizzle_kernel, unswizzle_kernel};

/// Inputs are read as vectors of 4 words (16 bytes).
const INPUT_VECTOR: usize = 4;

/// Units per cube of the rowwise-only MXFP8 kernel (one unit per 32-element block).
const MX_ROWWISE_UNITS: usize = 256;
const NV_ROWWISE_UNITS: usize = 256;

/// `mxfp8_strip_kernel` reads 2-word (8-byte) vectors: 4 columns of 16-bit values.
const MX_STRIP_VECTOR: usize = 2;

/// Whether to fully unroll the kernels' per-row loops: yes on CUDA (register arrays), no on wgpu,
/// where CubeCL's optimizer takes minutes over the unrolled IR and lavapipe gains nothing.
fn unroll<R: Runtime>(client: &ComputeClient<R>) -> bool {
    !R::name(client).starts_with("wgpu")
}

static INTEGER_FP8_ENCODER: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Makes every runtime use the integer FP8 encoder from the next launch on (`false`: each
/// runtime's own choice again). For benchmarks and tests comparing the two; both give the same codes.
pub fn force_integer_fp8_encoder(force: bool) {
    INTEGER_FP8_ENCODER.store(force, std::sync::atomic::Ordering::Relaxed);
}

thread_local! {
    static TILE_QUANTIZE_KERNELS: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Makes MXFP8, FP8 block and NVFP4 quantization launched from this thread use their tile
/// kernels (`mxfp8_kernel`, `fp8_block_kernel`, `nvfp4_kernel`) for every case they take (`false`:
/// the launcher's choice again, which takes `mxfp8_strip_kernel` / `fp8_block_transposed_kernel`
/// / `nvfp4_strip_kernel` for most 16-bit cases, and `nvfp4_rowwise_kernel` for NVFP4's 1D
/// rowwise-only casts). For benchmarks and tests comparing them; all give the same bytes. Per
/// thread, so that a test forcing it does not change the kernels of tests running beside it.
pub fn force_tile_quantize_kernels(force: bool) {
    TILE_QUANTIZE_KERNELS.with(|f| f.set(force));
}

fn tile_kernels_forced() -> bool {
    TILE_QUANTIZE_KERNELS.with(|f| f.get())
}

/// The FP8 encoder for a runtime: the conversion instruction on CUDA devices that have it (sm_89+;
/// CubeCL registers FP8 conversions there, and the vendored code generator makes them saturate),
/// integer arithmetic elsewhere (wgpu's FP8 conversions, where a Vulkan driver has them, are not
/// known to round and saturate as the formats need).
pub fn fp8_encoder<R: Runtime>(client: &ComputeClient<R>) -> Fp8Encoder {
    use cubecl::ir::features::{EnumSet, TypeUsage};
    let converts = |usage: EnumSet<TypeUsage>| usage.contains(TypeUsage::Conversion);
    if !INTEGER_FP8_ENCODER.load(std::sync::atomic::Ordering::Relaxed)
        && R::name(client) == "cuda"
        && converts(cubecl::e4m3::supported_uses(client))
        && converts(cubecl::e5m2::supported_uses(client))
    {
        Fp8Encoder::Instruction
    } else {
        Fp8Encoder::Integer
    }
}

/// A shape or argument a kernel cannot take.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelError {
    pub value: String,
    pub rule: String,
}

impl std::fmt::Display for KernelError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.value, self.rule)
    }
}

impl std::error::Error for KernelError {}

fn require(ok: bool, value: impl Into<String>, rule: impl Into<String>) -> Result<(), KernelError> {
    if ok {
        Ok(())
    } else {
        Err(KernelError {
            value: value.into(),
            rule: rule.into(),
        })
    }
}

/// A contiguous row-major `[rows, cols]` input matrix in device memory.
#[derive(Clone, Copy)]
pub struct InputMatrix<'a> {
    pub handle: &'a Handle,
    pub rows: usize,
    pub cols: usize,
    pub kind: ElemKind,
}

impl InputMatrix<'_> {
    fn words(&self) -> usize {
        self.rows * self.cols * self.kind.bytes() / 4
    }

    fn arg<R: Runtime>(&self) -> ArrayArg<R> {
        unsafe { ArrayArg::from_raw_parts(self.handle.clone(), self.words()) }
    }

    /// Both dimensions must be multiples of `row_block` / `col_block` (and non-zero).
    pub(crate) fn require_blocks(
        &self,
        row_block: usize,
        col_block: usize,
        format: &str,
    ) -> Result<(), KernelError> {
        require(
            self.rows > 0 && self.cols > 0,
            format!("shape [{}, {}]", self.rows, self.cols),
            format!("{format} needs a non-empty matrix"),
        )?;
        require(
            self.cols % col_block == 0,
            format!("K = {}", self.cols),
            format!("{format} needs K divisible by {col_block}"),
        )?;
        require(
            self.rows % row_block == 0,
            format!("M = {}", self.rows),
            format!("{format} needs M divisible by {row_block}"),
        )?;
        require(
            self.rows * self.cols < u32::MAX as usize,
            format!("{} elements", self.rows * self.cols),
            "quantize kernels index elements with 32 bits",
        )
    }
}

/// Which representations to produce.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Directions {
    pub rowwise: bool,
    pub columnwise: bool,
}

impl Directions {
    fn flags(self) -> u32 {
        (if self.rowwise { flags::ROWWISE } else { 0 })
            | (if self.columnwise {
                flags::COLUMNWISE
            } else {
                0
            })
    }
}

/// The row groups of a grouped (MoE) matrix: group g holds rows `[start[g], start[g] + rows[g])`
/// (u32 device arrays of `count` values). Groups follow each other from row 0, each a multiple of
/// 128 rows; rows after the last group form a tail that must hold zeros. Quantized grouped, every
/// group gets what quantizing its slice alone would give: its own per-tensor scale or global
/// amax, its own transposed columnwise block (`[cols, rows_g]` at `start_g * cols` elements).
#[derive(Clone, Copy)]
pub struct RowGroups<'a> {
    pub start: &'a Handle,
    pub rows: &'a Handle,
    pub count: usize,
}

impl RowGroups<'_> {
    pub(crate) fn args<R: Runtime>(&self) -> (ArrayArg<R>, ArrayArg<R>) {
        (arg(self.start, self.count), arg(self.rows, self.count))
    }
}

/// A matrix read through a row map: its row r is row `index[r]` (u32 or non-negative i32, one
/// per row of the matrix) of the source, whose `InputMatrix::rows` are then the source's
/// (`src_rows`), or a zero row where `index[r] >= src_rows`. The grouped FP8 per-tensor cast
/// reads a packed token batch this way straight into its aligned layout
/// (`GroupLayout::aligned_to_packed`), so the padded copy is never written.
#[derive(Clone, Copy)]
pub struct RowGather<'a> {
    pub index: &'a Handle,
    /// Rows of the matrix the kernel sees (the index's length).
    pub rows: usize,
}

/// The matrix a kernel sees (`rows` from the gather) and the row-map arguments: the index (a
/// dummy without gather) and the source's row count.
pub(crate) fn gather_args<R: Runtime>(
    client: &ComputeClient<R>,
    x: InputMatrix,
    gather: Option<RowGather>,
) -> (usize, ArrayArg<R>, usize) {
    match gather {
        Some(g) => (g.rows, arg(g.index, g.rows), x.rows),
        None => (x.rows, arg(&dummy(client), 1), x.rows),
    }
}

/// Group arrays and count of an optional grouping (dummies and 1 for an ungrouped matrix).
fn group_args<R: Runtime>(
    client: &ComputeClient<R>,
    groups: Option<RowGroups>,
) -> (ArrayArg<R>, ArrayArg<R>, usize) {
    match groups {
        Some(g) => {
            let (start, rows) = g.args();
            (start, rows, g.count)
        }
        None => {
            let dummy = dummy(client);
            (arg(&dummy, 1), arg(&dummy, 1), 1)
        }
    }
}

/// Device buffers of one representation.
#[derive(Debug, Clone)]
pub struct DirectionOutput {
    /// Code bytes (packed in u32 words), row-major in the representation's layout.
    pub codes: Handle,
    /// Block scales (E8M0/E4M3 bytes, or f32 `scale_inv` for FP8 block), or the one f32
    /// `scale_inv` of FP8 per-tensor scaling.
    pub scales: Handle,
    /// f32 amax of the representation, where the format keeps one (FP8 per-tensor, NVFP4).
    pub amax: Option<Handle>,
}

#[derive(Debug, Clone)]
pub struct QuantizeOutput {
    pub rowwise: Option<DirectionOutput>,
    pub columnwise: Option<DirectionOutput>,
}

impl QuantizeOutput {
    /// The outputs of the directions asked for (a kernel allocates both; the other is dropped).
    fn kept(directions: Directions, rowwise: DirectionOutput, columnwise: DirectionOutput) -> Self {
        QuantizeOutput {
            rowwise: directions.rowwise.then_some(rowwise),
            columnwise: directions.columnwise.then_some(columnwise),
        }
    }
}

/// A cube count of at least `cubes` cubes, spread over dimensions within the hardware limits
/// (kernels index with ABSOLUTE_POS and check bounds, so extra cubes idle).
pub(crate) fn linear_cubes<R: Runtime>(client: &ComputeClient<R>, cubes: usize) -> CubeCount {
    cubecl::server::CubeCountSelection::new(client, cubes.max(1) as u32).cube_count()
}

fn ceil_div(a: usize, b: usize) -> usize {
    a.div_ceil(b)
}

fn round_up(a: usize, b: usize) -> usize {
    a.div_ceil(b) * b
}

/// Zero-filled requests up to this many words come from `zeroed::zeroed_words`'s arena (no
/// launch of their own).
const ARENA_WORDS: usize = 1024;

/// A buffer of `words` u32 set to `value` on the device (no host copy). Small zeroed buffers (the
/// amaxes' accumulators) are slots of an arena zeroed by one launch for many of them.
pub fn filled<R: Runtime>(client: &ComputeClient<R>, words: usize, value: u32) -> Handle {
    if value == 0 && words <= ARENA_WORDS {
        return crate::util::zeroed::zeroed_words(client, words);
    }
    let handle = client.empty(words.max(1) * 4);
    fill(client, &handle, words.max(1), value);
    handle
}

/// Sets the first `words` u32 of `handle` (a buffer or a view) to `value`.
pub fn fill<R: Runtime>(client: &ComputeClient<R>, handle: &Handle, words: usize, value: u32) {
    if words == 0 {
        return;
    }
    let units = 256usize;
    unsafe {
        fill_kernel::launch_unchecked::<R>(
            client,
            linear_cubes(client, ceil_div(words, units)),
            CubeDim::new_1d(units as u32),
            ArrayArg::from_raw_parts(handle.clone(), words),
            value,
        )
    };
}

fn dummy<R: Runtime>(client: &ComputeClient<R>) -> Handle {
    client.empty(16)
}

pub(crate) fn arg<R: Runtime>(handle: &Handle, words: usize) -> ArrayArg<R> {
    unsafe { ArrayArg::from_raw_parts(handle.clone(), words.max(1)) }
}

/// Cubes for a grid-stride pass over `work` items.
pub(crate) fn stride_cubes<R: Runtime>(client: &ComputeClient<R>, work: usize, units: usize) -> u32 {
    let sms = client
        .properties()
        .hardware
        .num_streaming_multiprocessors
        .unwrap_or(16) as usize;
    ceil_div(work, units).clamp(1, sms.max(1) * 8) as u32
}

/// `max |x|` (NaN skipped) as f32 bits in a one-word buffer.
pub fn amax<R: Runtime>(client: &ComputeClient<R>, x: InputMatrix) -> Result<Handle, KernelError> {
    x.require_blocks(1, 8, "amax")?;
    let out = filled(client, 1, 0);
    let chunks = x.rows * x.cols / 8;
    unsafe {
        amax_kernel::launch_unchecked::<R>(
            client,
            CubeCount::new_1d(stride_cubes(client, chunks, AMAX_UNITS)),
            CubeDim::new_1d(AMAX_UNITS as u32),
            INPUT_VECTOR,
            x.arg(),
            arg(&out, 1),
            chunks,
            x.kind,
        )
    };
    Ok(out)
}

/// Rowwise amax and the amax of `RHT(xᵀ)`, in one read.
pub fn amax_with_rht<R: Runtime>(
    client: &ComputeClient<R>,
    x: InputMatrix,
) -> Result<(Handle, Handle), KernelError> {
    x.require_blocks(16, 8, "amax with RHT")?;
    let rowwise = filled(client, 1, 0);
    let rht = filled(client, 1, 0);
    let pieces = (x.rows / 16) * (x.cols / 2);
    unsafe {
        amax_rht_kernel::launch_unchecked::<R>(
            client,
            CubeCount::new_1d(stride_cubes(client, pieces, AMAX_UNITS)),
            CubeDim::new_1d(AMAX_UNITS as u32),
            arg(x.handle, x.words()),
            arg(&rowwise, 1),
            arg(&rht, 1),
            x.rows,
            x.cols,
            x.kind,
        )
    };
    Ok((rowwise, rht))
}

/// One amax per row group (f32 bits, `[groups.count]`), and with `rht` one amax of `RHT(xᵀ)` per
/// group. Needs `cols % 2 == 0`; every group's rows are a multiple of 16.
pub fn group_amax<R: Runtime>(
    client: &ComputeClient<R>,
    x: InputMatrix,
    groups: RowGroups,
    rht: bool,
) -> Result<(Handle, Handle), KernelError> {
    group_amax_gathered(client, x, groups, rht, None)
}

/// `group_amax` of the matrix `x` read through `gather` (`RowGather`).
pub fn group_amax_gathered<R: Runtime>(
    client: &ComputeClient<R>,
    x: InputMatrix,
    groups: RowGroups,
    rht: bool,
    gather: Option<RowGather>,
) -> Result<(Handle, Handle), KernelError> {
    let (rows, row_index, src_rows) = gather_args(client, x, gather);
    InputMatrix { rows, ..x }.require_blocks(GROUP_AMAX_ROWS, 8, "grouped amax")?;
    let rowwise = filled(client, groups.count, 0);
    let post_rht = if rht {
        filled(client, groups.count, 0)
    } else {
        dummy(client)
    };
    let (start, group_rows) = groups.args();
    unsafe {
        group_amax_kernel::launch_unchecked::<R>(
            client,
            CubeCount::Static(
                ceil_div(x.cols, GROUP_AMAX_COLS) as u32,
                (rows / GROUP_AMAX_ROWS) as u32,
                1,
            ),
            CubeDim::new_1d(AMAX_UNITS as u32),
            arg(x.handle, x.words()),
            start,
            group_rows,
            row_index,
            arg(&rowwise, groups.count),
            arg(&post_rht, groups.count),
            x.cols,
            groups.count,
            src_rows,
            x.kind,
            rht,
            gather.is_some(),
        )
    };
    Ok((rowwise, post_rht))
}

/// Grouped kernels need every group, hence the whole matrix, in whole 128-row chunks.
fn require_grouped_rows(x: &InputMatrix, groups: Option<RowGroups>) -> Result<(), KernelError> {
    match groups {
        Some(g) => require(
            x.rows % 128 == 0 && g.count > 0,
            format!("M = {} with {} groups", x.rows, g.count),
            "a grouped matrix has at least one group and M divisible by 128",
        ),
        None => Ok(()),
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

/// Byte sizes of MXFP8 compact scales: rowwise `[roundup(M,128), roundup(K/32,4)]`, columnwise
/// `[roundup(M/32,4), roundup(K,128)]`.
pub fn mxfp8_scale_shapes(rows: usize, cols: usize) -> ([usize; 2], [usize; 2]) {
    (
        [round_up(rows, 128), round_up(cols / 32, 4)],
        [round_up(rows / 32, 4), round_up(cols, 128)],
    )
}

/// Byte sizes of NVFP4 compact scales: rowwise `[roundup(M,128), roundup(K/16,4)]`, columnwise
/// `[roundup(K,128), roundup(M/16,4)]`.
pub fn nvfp4_scale_shapes(rows: usize, cols: usize) -> ([usize; 2], [usize; 2]) {
    (
        [round_up(rows, 128), round_up(cols / 16, 4)],
        [round_up(cols, 128), round_up(rows / 16, 4)],
    )
}

/// A byte buffer for `[r, c]` scales of which the kernel writes the cells of `written` (rows,
/// columns): zeroed where the shape has padding cells (they must read 0) or `written` is not
/// known (`None`), left as allocated where it has none, since every byte is written and the
/// fill would be a launch and a pass of its own (4 MiB for 16384 x 8192 MXFP8).
fn scale_bytes<R: Runtime>(
    client: &ComputeClient<R>,
    shape: [usize; 2],
    written: Option<[usize; 2]>,
) -> Handle {
    if written == Some(shape) {
        client.empty((shape[0] * shape[1]).max(4))
    } else {
        filled(client, shape[0] * shape[1] / 4, 0)
    }
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
    let flags = directions.flags() | if swizzled { flags::SWIZZLED } else { 0 };
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
    let flags = directions.flags() | if swizzled { flags::SWIZZLED } else { 0 };
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

/// Swizzles a padded compact `[rows, cols]` byte matrix (`rows % 128 == 0`, `cols % 4 == 0`).
/// With `transpose`, the compact input is `[cols, rows]` and its transpose is swizzled.
pub fn swizzle<R: Runtime>(
    client: &ComputeClient<R>,
    compact: &Handle,
    rows: usize,
    cols: usize,
    transpose: bool,
) -> Result<Handle, KernelError> {
    relayout(client, compact, rows, cols, transpose, true)
}

/// Inverse of [`swizzle`].
pub fn unswizzle<R: Runtime>(
    client: &ComputeClient<R>,
    swizzled: &Handle,
    rows: usize,
    cols: usize,
    transpose: bool,
) -> Result<Handle, KernelError> {
    relayout(client, swizzled, rows, cols, transpose, false)
}

fn relayout<R: Runtime>(
    client: &ComputeClient<R>,
    input: &Handle,
    rows: usize,
    cols: usize,
    transpose: bool,
    to_swizzled: bool,
) -> Result<Handle, KernelError> {
    require(
        rows % 128 == 0 && cols % 4 == 0 && rows > 0 && cols > 0,
        format!("scale shape [{rows}, {cols}]"),
        "swizzling needs scales padded to 128 x 4",
    )?;
    let n = rows * cols;
    let out = client.empty(n);
    let units = 256usize;
    let count = linear_cubes(client, ceil_div(n, units));
    let dim = CubeDim::new_1d(units as u32);
    unsafe {
        if to_swizzled {
            swizzle_kernel::launch_unchecked::<R>(
                client,
                count,
                dim,
                arg(input, n),
                arg(&out, n),
                rows,
                cols,
                transpose,
            )
        } else {
            unswizzle_kernel::launch_unchecked::<R>(
                client,
                count,
                dim,
                arg(input, n),
                arg(&out, n),
                rows,
                cols,
                transpose,
            )
        }
    };
    Ok(out)
}

/// How FP8 codes are scaled, for dequantize.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fp8Scales {
    Tensor,
    Block1x128,
    Block128x128,
}

impl Fp8Scales {
    /// Storage rows one scale covers: 0 for one tensor scale, else 1 (1x128) or 128 (128x128).
    pub(crate) fn rows_per_block(self) -> usize {
        match self {
            Fp8Scales::Tensor => 0,
            Fp8Scales::Block1x128 => 1,
            Fp8Scales::Block128x128 => 128,
        }
    }
}

/// Dequantizes FP8 codes (per-tensor or block) to f32 `[M, K]`. `transposed`: codes are `[K, M]`.
pub fn dequantize_fp8<R: Runtime>(
    client: &ComputeClient<R>,
    codes: &Handle,
    scales: &Handle,
    rows: usize,
    cols: usize,
    fp8: Fp8Kind,
    scale_kind: Fp8Scales,
    transposed: bool,
) -> Handle {
    let n = rows * cols;
    let (storage_rows, storage_cols) = if transposed {
        (cols, rows)
    } else {
        (rows, cols)
    };
    let scale_rows_per_block = scale_kind.rows_per_block();
    let scale_words = match scale_kind {
        Fp8Scales::Tensor => 1,
        _ => (storage_rows / scale_rows_per_block) * (storage_cols / 128),
    };
    let out = client.empty(n * 4);
    let units = 256usize;
    unsafe {
        dequantize_fp8_kernel::launch_unchecked::<R>(
            client,
            linear_cubes(client, ceil_div(n / 4, units)),
            CubeDim::new_1d(units as u32),
            arg(codes, n / 4),
            arg(scales, scale_words),
            arg(&out, n),
            storage_rows,
            storage_cols,
            fp8,
            scale_rows_per_block,
            transposed,
        )
    };
    out
}

/// Dequantizes every group of a grouped FP8 matrix (`dequantize_fp8_grouped_kernel`) to f32
/// `[rows, cols]` in one launch; `row_group` holds `rows` i32 labels, `groups` start and length
/// per group. Padding rows come out as zeros.
#[allow(clippy::too_many_arguments)]
pub fn dequantize_fp8_grouped<R: Runtime>(
    client: &ComputeClient<R>,
    codes: &Handle,
    scales: &Handle,
    row_group: &Handle,
    groups: RowGroups,
    rows: usize,
    cols: usize,
    fp8: Fp8Kind,
    scale_kind: Fp8Scales,
    transposed: bool,
) -> Handle {
    let n = rows * cols;
    let scale_rows_per_block = scale_kind.rows_per_block();
    let scale_words = match scale_kind {
        Fp8Scales::Tensor => groups.count,
        // One per (rows per block x 128) elements, either direction (groups are 128-row chunks).
        _ => rows * cols / (128 * scale_rows_per_block),
    };
    let out = client.empty(n.max(1) * 4);
    let units = 256usize;
    let (start, len) = groups.args();
    unsafe {
        dequantize_fp8_grouped_kernel::launch_unchecked::<R>(
            client,
            linear_cubes(client, ceil_div(n, units)),
            CubeDim::new_1d(units as u32),
            arg(codes, n.div_ceil(4)),
            arg(scales, scale_words),
            arg(row_group, rows),
            start,
            len,
            arg(&out, n),
            rows,
            cols,
            groups.count,
            fp8,
            scale_rows_per_block,
            transposed,
        )
    };
    out
}

/// Dequantizes MXFP8 codes (compact scales) to f32 `[M, K]`.
pub fn dequantize_mxfp8<R: Runtime>(
    client: &ComputeClient<R>,
    codes: &Handle,
    scales: &Handle,
    rows: usize,
    cols: usize,
    fp8: Fp8Kind,
    rowwise: bool,
) -> Handle {
    let n = rows * cols;
    let (row_shape, col_shape) = mxfp8_scale_shapes(rows, cols);
    let shape = if rowwise { row_shape } else { col_shape };
    let out = client.empty(n * 4);
    let units = 256usize;
    unsafe {
        dequantize_mxfp8_kernel::launch_unchecked::<R>(
            client,
            linear_cubes(client, ceil_div(n / 4, units)),
            CubeDim::new_1d(units as u32),
            arg(codes, n / 4),
            arg(scales, shape[0] * shape[1]),
            arg(&out, n),
            rows,
            cols,
            shape[1],
            fp8,
            rowwise,
        )
    };
    out
}

/// Dequantizes NVFP4 codes (compact scales) to f32 `[M, K]`.
pub fn dequantize_nvfp4<R: Runtime>(
    client: &ComputeClient<R>,
    codes: &Handle,
    scales: &Handle,
    amax: &Handle,
    rows: usize,
    cols: usize,
    rowwise: bool,
    rht: bool,
) -> Handle {
    let n = rows * cols;
    let (row_shape, col_shape) = nvfp4_scale_shapes(rows, cols);
    let (shape, storage_rows, storage_cols) = if rowwise {
        (row_shape, rows, cols)
    } else {
        (col_shape, cols, rows)
    };
    let out = client.empty(n * 4);
    let units = 256usize;
    unsafe {
        dequantize_nvfp4_kernel::launch_unchecked::<R>(
            client,
            linear_cubes(client, ceil_div(n / 16, units)),
            CubeDim::new_1d(units as u32),
            arg(codes, n / 8),
            arg(scales, shape[0] * shape[1]),
            arg(amax, 1),
            arg(&out, n),
            storage_rows,
            storage_cols,
            shape[1],
            !rowwise,
            rht && !rowwise,
        )
    };
    out
}

/// Copies `bytes` (a multiple of 16) from `input` into a new buffer: the device-copy baseline.
pub fn copy<R: Runtime>(client: &ComputeClient<R>, input: &Handle, bytes: usize) -> Handle {
    let out = client.empty(bytes);
    let words = bytes / 4;
    let units = 256usize;
    unsafe {
        copy_kernel::launch_unchecked::<R>(
            client,
            linear_cubes(client, ceil_div(words / INPUT_VECTOR, units)),
            CubeDim::new_1d(units as u32),
            INPUT_VECTOR,
            arg(input, words),
            arg(&out, words),
        )
    };
    out
}

/// Copies bytes `offset .. offset + len` of `input` (both multiples of 4) into a new buffer.
pub fn copy_range<R: Runtime>(
    client: &ComputeClient<R>,
    input: &Handle,
    offset: usize,
    len: usize,
) -> Handle {
    assert!(offset % 4 == 0 && len % 4 == 0, "word-aligned byte range {offset}+{len}");
    let out = client.empty(len.max(4));
    let words = len / 4;
    let units = 256usize;
    unsafe {
        copy_words_kernel::launch_unchecked::<R>(
            client,
            linear_cubes(client, ceil_div(words.max(1), units)),
            CubeDim::new_1d(units as u32),
            arg(input, (offset + len) / 4),
            arg(&out, words),
            offset / 4,
        )
    };
    out
}

/// The `count` words of `input` spread to one per `stride` words (zeros between), in a new buffer.
pub fn spread_words<R: Runtime>(
    client: &ComputeClient<R>,
    input: &Handle,
    count: usize,
    stride: usize,
) -> Handle {
    let words = count * stride;
    let out = client.empty(words.max(1) * 4);
    let units = 256usize;
    unsafe {
        crate::util::buffers::spread_words_kernel::launch_unchecked::<R>(
            client,
            linear_cubes(client, ceil_div(words.max(1), units)),
            CubeDim::new_1d(units as u32),
            arg(input, count),
            arg(&out, words),
            stride,
        )
    };
    out
}

/// Writes `value` to the READY word of a stream-flags buffer once everything queued before it on
/// this client's stream has run (see `stream_flags`).
pub fn signal_flag<R: Runtime>(client: &ComputeClient<R>, flags: &Handle, value: u32) {
    unsafe {
        crate::util::stream_flags::signal_kernel::launch_unchecked::<R>(
            client,
            CubeCount::Static(1, 1, 1),
            CubeDim::new_1d(1),
            arg(flags, crate::util::stream_flags::FLAG_WORDS),
            value,
        )
    };
}

/// Holds this client's stream until the DONE word of `flags` reaches `value` (or `max_polls`
/// reads pass, which it records in TIMED_OUT).
pub fn wait_flag<R: Runtime>(
    client: &ComputeClient<R>,
    flags: &Handle,
    value: u32,
    max_polls: u32,
) {
    unsafe {
        crate::util::stream_flags::wait_kernel::launch_unchecked::<R>(
            client,
            CubeCount::Static(1, 1, 1),
            CubeDim::new_1d(1),
            arg(flags, crate::util::stream_flags::FLAG_WORDS),
            value,
            max_polls,
        )
    };
}
