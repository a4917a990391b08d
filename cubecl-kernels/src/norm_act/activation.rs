//! LayerNormMLP's activations (TE's 12, spec section 10) forward and backward, with the
//! launchers beside the kernels. Gated activations read `h [rows, 2F]` and write
//! `act(h[:, :F]) · gate(h[:, F:])`; their backward writes both halves of `dh [rows, 2F]`.
//!
//! Each unit owns one chunk of columns (8 halves or 4 f32: one 16-byte load per row and operand
//! where the width allows, else 4 or 2 elements) of a block of `ACT_BLOCK_ROWS` rows. Forward can
//! take the amax of the stored output for the FP8 current-scaling quantizer that reads it next
//! (which then skips its amax pass), or take only that amax without storing (the first pass of
//! the fused activation cast, `activation_amax`); backward can also take that amax, and the bias
//! gradient `Σ_rows dh` as block partials summed afterwards (`partial_sums`). Arithmetic is f32;
//! stores round to the dtype.

use cubecl::prelude::*;
use cubecl::server::Handle;

use crate::cast::codec::Fp8Encoder;
use crate::norm_act::act_fn::{
    act_derivative, act_value, gate_derivative, gate_value, ActFn, ActivationParams,
};
use crate::util::buffers::{arg, filled};
use crate::util::elements::ElemKind;
use crate::util::error::KernelError;
use crate::util::matrix::{require_pairs, WordMatrix};
use crate::util::pairs::{packed_amax, stored_word, vector_element, word_elements};
use crate::util::partial_sums::column_partials_sum;
use crate::util::reduce::cube_max_into;

pub const ACT_UNITS: usize = 256;
/// Rows per unit (and per block of the bias-gradient partials).
pub const ACT_BLOCK_ROWS: usize = 64;
/// Rows a unit loads before it computes on them. With one 4-byte word per row and operand and
/// one row in flight the kernels waited on memory latency (Nsight Compute on an H200: 203 us
/// forward and 330 us backward at 8192 x 16384 gelu, about half the bandwidth); four rows of
/// 4-byte words then ran at 69-76 % of DRAM bandwidth, issue-bound (H100). A unit now loads 16
/// bytes per row and operand.
const ACT_ROW_STEP: usize = 4;
const ACT_STEPS: usize = ACT_BLOCK_ROWS / ACT_ROW_STEP;
// The forward kernel takes its steps in pairs (two register buffers).
const _: () = assert!(ACT_STEPS % 2 == 0);

/// Rows per step of the backward kernel, which reads two or three operands per row: gated keeps
/// one (with four rows of three operands in flight it ran slower, swiglu 420 -> 568 us at
/// 8192 x 16384 on an H200, in 4-byte words), the others two.
fn backward_step_rows(gated: bool) -> usize {
    if gated {
        1
    } else {
        2
    }
}

#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub struct ActivationConfig {
    /// dtype of h, the output, dy and dh.
    pub kind: ElemKind,
    pub act: ActFn,
    pub gated: bool,
    /// The gate is `clamp(x, -limit, limit) + offset` (clamped_swiglu) rather than `x`.
    pub clamped_gate: bool,
    /// Record the amax of the stored output (atomic max into `amax_out[0]`).
    pub amax: bool,
    /// Backward: write bias-gradient partials.
    pub dbias: bool,
    /// How values are rounded to a 16-bit dtype (`pairs::pair_word_by`): the conversion
    /// instruction where the FP8 casts use theirs (CUDA), else integer rounding; the same bits
    /// but for NaN payloads.
    pub encoder: Fp8Encoder,
}

/// Elements of a chunk: `words` words of f32, or twice as many halves.
pub(crate) fn chunk_elements(words: usize, kind: ElemKind) -> usize {
    if kind == ElemKind::F32 {
        words
    } else {
        2 * words
    }
}

/// The widest chunk (4, 2 or 1 words) that tiles a row of `cols` elements: one 16-byte load or
/// store per row and operand where the width allows (an even width always allows one word).
pub(crate) fn chunk_words(cols: usize, kind: ElemKind) -> usize {
    [4, 2, 1]
        .into_iter()
        .find(|&w| cols % chunk_elements(w, kind) == 0)
        .unwrap_or(1)
}

/// The elements of chunk `v` into `out[offset..]`.
#[cube]
fn unpack_chunk<N: Size>(
    v: Vector<u32, N>,
    out: &mut Array<f32>,
    offset: usize,
    #[comptime] words: usize,
    #[comptime] kind: ElemKind,
) {
    let per_word = comptime![word_elements(kind)];
    #[unroll]
    for w in 0..words {
        #[unroll]
        for e in 0..per_word {
            out[offset + per_word * w + e] = vector_element::<N>(v, w, e, kind);
        }
    }
}

/// `values[offset..]` rounded to `kind` (by `encoder`) as one chunk.
#[cube]
fn pack_chunk<N: Size>(
    values: &Array<f32>,
    offset: usize,
    #[comptime] words: usize,
    #[comptime] kind: ElemKind,
    #[comptime] encoder: Fp8Encoder,
) -> Vector<u32, N> {
    let mut packed = Vector::<u32, N>::empty();
    let per_word = comptime![word_elements(kind)];
    #[unroll]
    for w in 0..words {
        let a = values[offset + per_word * w];
        let mut b = 0.0f32;
        if comptime![per_word == 2] {
            b = values[offset + 2 * w + 1];
        }
        packed[w] = stored_word(a, b, kind, encoder);
    }
    packed
}

/// The values a store of `packed` keeps, back into `values[offset..]` (what the amax and the
/// bias gradient fold), and their amax folded into `local`.
#[cube]
fn stored_values<N: Size>(
    packed: Vector<u32, N>,
    values: &mut Array<f32>,
    offset: usize,
    local: u32,
    #[comptime] words: usize,
    #[comptime] kind: ElemKind,
) -> u32 {
    unpack_chunk::<N>(packed, values, offset, words, kind);
    packed_amax::<N>(packed, local, words, kind)
}

/// The chunks of rows `row0..row0 + ACT_ROW_STEP` (those before `end`) of the unit's column
/// chunk into `xs` (and the gate half's into `gs` when gated): loads only, so that they are in
/// flight while the unit computes on the previous step's chunks.
#[cube]
#[allow(clippy::too_many_arguments)]
fn load_forward_rows<N: Size>(
    h: &Array<Vector<u32, N>>,
    xs: &mut Array<Vector<u32, N>>,
    gs: &mut Array<Vector<u32, N>>,
    row0: usize,
    end: usize,
    h_chunks: usize,
    chunks: usize,
    chunk: usize,
    #[comptime] gated: bool,
) {
    #[unroll]
    for i in 0..ACT_ROW_STEP {
        if row0 + i < end {
            let at = (row0 + i) * h_chunks + chunk;
            xs[i] = h[at];
            if comptime![gated] {
                gs[i] = h[at + chunks];
            }
        }
    }
}

/// `act(x) (· gate(g))`.
#[cube]
fn forward_value(x: f32, g: f32, alpha: f32, limit: f32, offset: f32, #[comptime] config: ActivationConfig) -> f32 {
    let mut y = act_value(x, alpha, limit, config.act);
    if comptime![config.gated] {
        y *= gate_value(g, limit, offset, config.clamped_gate);
    }
    y
}

/// The activation of the rows `load_forward_rows` loaded into `xs` / `gs`, stored (with
/// `store`) and its amax folded into `local` (with `config.amax`); returns the amax.
#[cube]
#[allow(clippy::too_many_arguments)]
fn forward_rows<N: Size>(
    xs: &Array<Vector<u32, N>>,
    gs: &Array<Vector<u32, N>>,
    out: &mut Array<Vector<u32, N>>,
    row0: usize,
    end: usize,
    chunks: usize,
    chunk: usize,
    alpha: f32,
    limit: f32,
    offset: f32,
    local: u32,
    #[comptime] config: ActivationConfig,
    #[comptime] words: usize,
    #[comptime] store: bool,
) -> u32 {
    let mut m = local;
    #[unroll]
    for i in 0..ACT_ROW_STEP {
        let row = row0 + i;
        if row < end {
            let mut packed = Vector::<u32, N>::empty();
            #[unroll]
            for w in 0..words {
                let mut y = Array::<f32>::new(2usize);
                y[1] = 0.0f32;
                #[unroll]
                for e in 0..comptime![word_elements(config.kind)] {
                    let mut g = 0.0f32;
                    if comptime![config.gated] {
                        g = vector_element::<N>(gs[i], w, e, config.kind);
                    }
                    y[e] = forward_value(vector_element::<N>(xs[i], w, e, config.kind), g, alpha, limit, offset, config);
                }
                packed[w] = stored_word(y[0], y[1], config.kind, config.encoder);
            }
            if comptime![store] {
                out[row * chunks + chunk] = packed;
            }
            if comptime![config.amax] {
                // The amax of what is stored: the rounded values, read back from their bits.
                m = packed_amax::<N>(packed, m, words, config.kind);
            }
        }
    }
    m
}

/// `out [rows, F] = act(h[:, :F]) (· gate(h[:, F:]))`; `F = chunks` chunks of `words` words.
/// Without `store` only the amax of what would be stored is taken: the first pass of FP8
/// current scaling's fused activation cast.
///
/// A unit works through its 64 rows in steps of `ACT_ROW_STEP` and loads the next step's chunks
/// before it computes on the current ones (two register buffers, `a` and `b`). Loading a step and
/// then computing on it kept every unit either waiting on memory or computing: the amax-only
/// pass, whose compute (two MUFU operations an element) is about as long as its loads, ran at
/// 1.7-1.9 TB/s (142-157 µs for 268 MB of gelu input on an H100).
#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
pub fn activation_forward_kernel<N: Size>(
    h: &Array<Vector<u32, N>>,
    out: &mut Array<Vector<u32, N>>,
    amax_out: &mut Array<Atomic<u32>>,
    rows: usize,
    chunks: usize,
    alpha: f32,
    limit: f32,
    offset: f32,
    #[comptime] config: ActivationConfig,
    #[comptime] words: usize,
    #[comptime] store: bool,
) {
    let mut maxima = SharedMemory::<u32>::new(ACT_UNITS);
    let chunk = CUBE_POS_X as usize * ACT_UNITS + UNIT_POS as usize;
    let first = CUBE_POS_Y as usize * ACT_BLOCK_ROWS;
    let end = select(first + ACT_BLOCK_ROWS < rows, first + ACT_BLOCK_ROWS, rows);
    let h_chunks = if comptime![config.gated] { 2 * chunks } else { chunks };
    let mut m = 0u32;
    if chunk < chunks {
        let mut xa = Array::<Vector<u32, N>>::new(ACT_ROW_STEP);
        let mut ga = Array::<Vector<u32, N>>::new(ACT_ROW_STEP);
        let mut xb = Array::<Vector<u32, N>>::new(ACT_ROW_STEP);
        let mut gb = Array::<Vector<u32, N>>::new(ACT_ROW_STEP);
        load_forward_rows::<N>(h, &mut xa, &mut ga, first, end, h_chunks, chunks, chunk, config.gated);
        for pair in 0..comptime![ACT_STEPS / 2] {
            let row0 = first + 2 * pair * ACT_ROW_STEP;
            let row1 = row0 + ACT_ROW_STEP;
            load_forward_rows::<N>(h, &mut xb, &mut gb, row1, end, h_chunks, chunks, chunk, config.gated);
            m = forward_rows::<N>(
                &xa, &ga, out, row0, end, chunks, chunk, alpha, limit, offset, m, config, words, store,
            );
            load_forward_rows::<N>(
                h,
                &mut xa,
                &mut ga,
                row1 + ACT_ROW_STEP,
                end,
                h_chunks,
                chunks,
                chunk,
                config.gated,
            );
            m = forward_rows::<N>(
                &xb, &gb, out, row1, end, chunks, chunk, alpha, limit, offset, m, config, words, store,
            );
        }
    }
    if comptime![config.amax] {
        cube_max_into(m, &mut maxima, amax_out, 0usize, ACT_UNITS);
    }
}

fn act_grid(rows: usize, chunks: usize) -> CubeCount {
    CubeCount::Static(
        chunks.div_ceil(ACT_UNITS) as u32,
        rows.div_ceil(ACT_BLOCK_ROWS) as u32,
        1,
    )
}

fn require_width(h: &WordMatrix, gated: bool) -> Result<usize, KernelError> {
    let cols = if gated { h.cols / 2 } else { h.cols };
    if (gated && h.cols % 2 != 0) || cols % 2 != 0 || cols == 0 {
        return Err(KernelError {
            value: format!("activation input [{}, {}]", h.rows, h.cols),
            rule: "the activation kernels take an even output width (a gated input holds two \
                   halves of an even width)"
                .to_string(),
        });
    }
    Ok(cols)
}

/// Launches the forward kernel over `h`; `out` is written when `store`.
#[allow(clippy::too_many_arguments)]
fn launch_forward<R: Runtime>(
    client: &ComputeClient<R>,
    h: &WordMatrix,
    cols: usize,
    out: &Handle,
    amax: &Handle,
    params: ActivationParams,
    config: ActivationConfig,
    store: bool,
) {
    let words = chunk_words(cols, h.kind);
    let chunks = cols / chunk_elements(words, h.kind);
    let out_words = h.rows * cols * h.kind.bytes() / 4;
    unsafe {
        activation_forward_kernel::launch_unchecked::<R>(
            client,
            act_grid(h.rows, chunks),
            CubeDim::new_1d(ACT_UNITS as u32),
            words,
            h.arg(),
            arg(out, if store { out_words } else { words }),
            arg(amax, 1),
            h.rows,
            chunks,
            params.alpha,
            params.limit,
            params.offset,
            config,
            words,
            store,
        )
    };
}

/// The activation's output `[rows, F]` in h's dtype, and its amax when `config.amax`.
pub fn activation_forward<R: Runtime>(
    client: &ComputeClient<R>,
    h: WordMatrix,
    params: ActivationParams,
    config: ActivationConfig,
) -> Result<(Handle, Option<Handle>), KernelError> {
    require_pairs(&h, "activation input")?;
    let cols = require_width(&h, config.gated)?;
    let out = client.empty(h.rows * cols * h.kind.bytes());
    let amax = filled(client, 1, 0);
    launch_forward(client, &h, cols, &out, &amax, params, config, true);
    Ok((out, config.amax.then_some(amax)))
}

/// The amax (f32 bits) of what `activation_forward` would store, without storing it: the first
/// of FP8 current scaling's two passes over `h` when the cast applies the activation itself.
pub fn activation_amax<R: Runtime>(
    client: &ComputeClient<R>,
    h: WordMatrix,
    params: ActivationParams,
    config: ActivationConfig,
) -> Result<Handle, KernelError> {
    require_pairs(&h, "activation input")?;
    let cols = require_width(&h, config.gated)?;
    let amax = filled(client, 1, 0);
    let unused = client.empty(16);
    let config = ActivationConfig { amax: true, ..config };
    launch_forward(client, &h, cols, &unused, &amax, params, config, false);
    Ok(amax)
}

/// `dh [rows, F']` from `dy [rows, F]` and `h [rows, F']` (`F' = 2F` when gated; `F = chunks`
/// chunks of `words` words): `dh = dy · act'(h)`, or for gated `dh[:, :F] = dy · gate · act'(x)`,
/// `dh[:, F:] = dy · act(x) · gate'`.
#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
pub fn activation_backward_kernel<N: Size>(
    dy: &Array<Vector<u32, N>>,
    h: &Array<Vector<u32, N>>,
    dh: &mut Array<Vector<u32, N>>,
    amax_out: &mut Array<Atomic<u32>>,
    dbias: &mut Array<f32>,
    rows: usize,
    chunks: usize,
    alpha: f32,
    limit: f32,
    offset: f32,
    #[comptime] config: ActivationConfig,
    #[comptime] words: usize,
) {
    let mut maxima = SharedMemory::<u32>::new(ACT_UNITS);
    let per_chunk = comptime![chunk_elements(words, config.kind)];
    let chunk = CUBE_POS_X as usize * ACT_UNITS + UNIT_POS as usize;
    let block = CUBE_POS_Y as usize;
    let first = block * ACT_BLOCK_ROWS;
    let end = select(first + ACT_BLOCK_ROWS < rows, first + ACT_BLOCK_ROWS, rows);
    let h_chunks = if comptime![config.gated] { 2 * chunks } else { chunks };
    let mut local_amax = 0u32;
    if chunk < chunks {
        // Bias-gradient sums of the unit's columns (first half, and gate half when gated).
        let mut sums = Array::<f32>::new(comptime![2 * per_chunk]);
        #[unroll]
        for j in 0..comptime![2 * per_chunk] {
            sums[j] = 0.0f32;
        }
        let step_rows = comptime![backward_step_rows(config.gated)];
        let mut d = Array::<f32>::new(comptime![step_rows * per_chunk]);
        let mut x = Array::<f32>::new(comptime![step_rows * per_chunk]);
        let mut g = Array::<f32>::new(comptime![step_rows * per_chunk]);
        let mut dg = Array::<f32>::new(per_chunk);
        for step in 0..comptime![ACT_BLOCK_ROWS / step_rows] {
            let row0 = first + step * step_rows;
            #[unroll]
            for i in 0..step_rows {
                if row0 + i < end {
                    let at = (row0 + i) * h_chunks + chunk;
                    let o = i * per_chunk;
                    unpack_chunk::<N>(dy[(row0 + i) * chunks + chunk], &mut d, o, words, config.kind);
                    unpack_chunk::<N>(h[at], &mut x, o, words, config.kind);
                    if comptime![config.gated] {
                        unpack_chunk::<N>(h[at + chunks], &mut g, o, words, config.kind);
                    }
                }
            }
            #[unroll]
            for i in 0..step_rows {
                let row = row0 + i;
                if row < end {
                    let o = i * per_chunk;
                    #[unroll]
                    for j in 0..per_chunk {
                        let k = o + j;
                        if comptime![config.gated] {
                            let gate = g[k];
                            dg[j] = d[k]
                                * act_value(x[k], alpha, limit, config.act)
                                * gate_derivative(gate, limit, config.clamped_gate);
                            x[k] = d[k]
                                * gate_value(gate, limit, offset, config.clamped_gate)
                                * act_derivative(x[k], alpha, limit, config.act);
                        } else {
                            x[k] = d[k] * act_derivative(x[k], alpha, limit, config.act);
                        }
                    }
                    let at = row * h_chunks + chunk;
                    let packed = pack_chunk::<N>(&x, o, words, config.kind, config.encoder);
                    dh[at] = packed;
                    local_amax = stored_values::<N>(packed, &mut x, o, local_amax, words, config.kind);
                    if comptime![config.gated] {
                        let packed_g = pack_chunk::<N>(&dg, 0usize, words, config.kind, config.encoder);
                        dh[at + chunks] = packed_g;
                        local_amax =
                            stored_values::<N>(packed_g, &mut dg, 0usize, local_amax, words, config.kind);
                    }
                    if comptime![config.dbias] {
                        #[unroll]
                        for j in 0..per_chunk {
                            sums[j] += x[o + j];
                            if comptime![config.gated] {
                                sums[per_chunk + j] += dg[j];
                            }
                        }
                    }
                }
            }
        }
        if comptime![config.dbias] {
            let h_cols = h_chunks * per_chunk;
            let col = chunk * per_chunk;
            #[unroll]
            for j in 0..per_chunk {
                dbias[block * h_cols + col + j] = sums[j];
                if comptime![config.gated] {
                    dbias[block * h_cols + chunks * per_chunk + col + j] = sums[per_chunk + j];
                }
            }
        }
    }
    if comptime![config.amax] {
        cube_max_into(local_amax, &mut maxima, amax_out, 0usize, ACT_UNITS);
    }
}

/// What the activation backward writes.
pub struct ActivationBackwardOutput {
    /// dh `[rows, F']` in dy's dtype.
    pub dh: Handle,
    /// f32 bits of `max |dh|` when asked for.
    pub amax: Option<Handle>,
    /// f32 `[F']` `Σ_rows dh` when asked for.
    pub dbias: Option<Handle>,
}

/// dh from `dy [rows, F]` and the activation's input `h [rows, F']` (same dtype).
pub fn activation_backward<R: Runtime>(
    client: &ComputeClient<R>,
    dy: WordMatrix,
    h: &Handle,
    params: ActivationParams,
    config: ActivationConfig,
) -> Result<ActivationBackwardOutput, KernelError> {
    require_pairs(&dy, "activation grad_output")?;
    let h_cols = if config.gated { 2 * dy.cols } else { dy.cols };
    let h_matrix = WordMatrix {
        handle: h,
        rows: dy.rows,
        cols: h_cols,
        kind: dy.kind,
    };
    let dh = client.empty(h_matrix.bytes());
    let amax = filled(client, 1, 0);
    let blocks = dy.rows.div_ceil(ACT_BLOCK_ROWS);
    let partials = if config.dbias {
        client.empty(4 * blocks * h_cols)
    } else {
        client.empty(16)
    };
    let words = chunk_words(dy.cols, dy.kind);
    let chunks = dy.cols / chunk_elements(words, dy.kind);
    unsafe {
        activation_backward_kernel::launch_unchecked::<R>(
            client,
            act_grid(dy.rows, chunks),
            CubeDim::new_1d(ACT_UNITS as u32),
            words,
            dy.arg(),
            h_matrix.arg(),
            arg(&dh, h_matrix.words()),
            arg(&amax, 1),
            arg(&partials, if config.dbias { blocks * h_cols } else { 4 }),
            dy.rows,
            chunks,
            params.alpha,
            params.limit,
            params.offset,
            config,
            words,
        )
    };
    let dbias = config
        .dbias
        .then(|| column_partials_sum(client, &partials, blocks, h_cols));
    Ok(ActivationBackwardOutput {
        dh,
        amax: config.amax.then_some(amax),
        dbias,
    })
}
