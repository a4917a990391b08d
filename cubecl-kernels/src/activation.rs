//! LayerNormMLP's activations (TE's 12, spec section 10) forward and backward, with the
//! launchers beside the kernels. Gated activations read `h [rows, 2F]` and write
//! `act(h[:, :F]) · gate(h[:, F:])`; their backward writes both halves of `dh [rows, 2F]`.
//!
//! Each unit owns one column pair of a block of `ACT_BLOCK_ROWS` rows. Forward can take the amax
//! of the stored output for the FP8 current-scaling quantizer that reads it next (which then skips
//! its amax pass); backward can also take that amax, and the bias gradient `Σ_rows dh` as block
//! partials summed afterwards (`partial_sums`). Arithmetic is f32; stores round to the dtype.

use cubecl::prelude::*;
use cubecl::server::Handle;

use crate::codec::{abs_bits_for_amax, ElemKind};
use crate::launch::{filled, KernelError};
use crate::norm::{arg, require_pairs, WordMatrix};
use crate::pairs::{load_pair, round_to, store_pair};
use crate::partial_sums::column_partials_sum;
use crate::reduce::cube_max_into;

pub const ACT_UNITS: usize = 256;
/// Rows per unit (and per block of the bias-gradient partials).
pub const ACT_BLOCK_ROWS: usize = 64;
/// Rows a unit loads before it computes on them: a unit reads one word per row and operand, and
/// with one row in flight at a time the kernels waited on memory latency (Nsight Compute on an
/// H200: 203 us forward and 330 us backward at 8192 x 16384 gelu, about half the bandwidth).
const ACT_ROW_STEP: usize = 4;
const ACT_STEPS: usize = ACT_BLOCK_ROWS / ACT_ROW_STEP;

/// Rows per step of the backward kernel: gated backward keeps one (with four rows of three
/// operands in flight it ran slower, swiglu 420 -> 568 us at 8192 x 16384 on an H200, while
/// the others gained: gelu backward 351 -> 318 us).
fn backward_step_rows(gated: bool) -> usize {
    if gated {
        1
    } else {
        ACT_ROW_STEP
    }
}

/// The elementwise function of an activation (gated ones apply it to the first half).
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum ActFn {
    /// `x · (0.5 + 0.5 · tanh(x · (0.79788456 + 0.03567741 · x²)))` (gelu, geglu).
    Gelu,
    /// `x · σ(alpha · x)`, alpha = 1.702 (qgelu, qgeglu).
    Qgelu,
    /// `x · σ(x)` (silu, swiglu).
    Silu,
    /// `max(x, 0)` (relu, reglu).
    Relu,
    /// `(x > 0) · x²` (srelu, sreglu).
    Srelu,
    /// `σ(x)` (glu).
    Sigmoid,
    /// `min(x, limit) · σ(alpha · min(x, limit))` (clamped_swiglu's first half).
    ClampedSilu,
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
}

/// Runtime parameters: `alpha` (qgelu, clamped_swiglu), `limit` and `offset` (clamped_swiglu).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ActivationParams {
    pub alpha: f32,
    pub limit: f32,
    pub offset: f32,
}

#[cube]
fn sigmoid(x: f32) -> f32 {
    1.0f32 / (1.0f32 + f32::exp(-x))
}

/// `act(x)`.
#[cube]
pub fn act_value(x: f32, alpha: f32, limit: f32, #[comptime] act: ActFn) -> f32 {
    match act {
        ActFn::Gelu => {
            x * (0.5f32 + 0.5f32 * f32::tanh(x * (0.79788456f32 + 0.03567741f32 * x * x)))
        }
        ActFn::Qgelu => x * sigmoid(alpha * x),
        ActFn::Silu => x * sigmoid(x),
        ActFn::Relu => select(x > 0.0f32, x, 0.0f32),
        ActFn::Srelu => select(x > 0.0f32, x * x, 0.0f32),
        ActFn::Sigmoid => sigmoid(x),
        ActFn::ClampedSilu => {
            let c = select(x < limit, x, limit);
            c * sigmoid(alpha * c)
        }
    }
}

/// `act'(x)` (TE's `d*` functions in `common/util/math.h`).
#[cube]
pub fn act_derivative(x: f32, alpha: f32, limit: f32, #[comptime] act: ActFn) -> f32 {
    match act {
        ActFn::Gelu => {
            let t = f32::tanh(0.79788456f32 * x * (1.0f32 + 0.044715f32 * x * x));
            0.5f32 * x * ((1.0f32 - t * t) * (0.79788456f32 + 0.1070322243f32 * x * x))
                + 0.5f32 * (1.0f32 + t)
        }
        ActFn::Qgelu => {
            let s = sigmoid(alpha * x);
            alpha * x * s * (1.0f32 - s) + s
        }
        ActFn::Silu => {
            let s = sigmoid(x);
            x * s * (1.0f32 - s) + s
        }
        ActFn::Relu => select(x > 0.0f32, 1.0f32, 0.0f32),
        ActFn::Srelu => select(x > 0.0f32, 2.0f32 * x, 0.0f32),
        ActFn::Sigmoid => {
            let s = sigmoid(x);
            s * (1.0f32 - s)
        }
        ActFn::ClampedSilu => {
            let s = sigmoid(alpha * x);
            select(x <= limit, alpha * x * s * (1.0f32 - s) + s, 0.0f32)
        }
    }
}

/// The gate factor of a gated activation.
#[cube]
pub fn gate_value(g: f32, limit: f32, offset: f32, #[comptime] clamped: bool) -> f32 {
    if comptime![clamped] {
        let low = select(g > -limit, g, -limit);
        select(low < limit, low, limit) + offset
    } else {
        g
    }
}

/// `d gate / d g`.
#[cube]
fn gate_derivative(g: f32, limit: f32, #[comptime] clamped: bool) -> f32 {
    let mut d = 1.0f32;
    if comptime![clamped] {
        d = select(g >= -limit && g <= limit, 1.0f32, 0.0f32);
    }
    d
}

/// Elements `col, col + 1` of rows `row0 .. row0 + rows` of `m` (row stride `stride`) into
/// `out[2 i], out[2 i + 1]`, rows from `end` on skipped: one step's loads, issued together.
#[cube]
#[allow(clippy::too_many_arguments)]
fn load_row_pairs(
    m: &Array<u32>,
    out: &mut Array<f32>,
    row0: usize,
    end: usize,
    stride: usize,
    col: usize,
    #[comptime] rows: usize,
    #[comptime] kind: ElemKind,
) {
    #[unroll]
    for i in 0..rows {
        if row0 + i < end {
            let (a, b) = load_pair(m, (row0 + i) * stride + col, kind);
            out[2 * i] = a;
            out[2 * i + 1] = b;
        }
    }
}

#[cube]
fn fold_amax(local: u32, a: f32, b: f32, #[comptime] kind: ElemKind) -> u32 {
    let ma = abs_bits_for_amax(round_to(a, kind));
    let mb = abs_bits_for_amax(round_to(b, kind));
    let m = select(ma > local, ma, local);
    select(mb > m, mb, m)
}

/// `out [rows, F] = act(h[:, :F]) (· gate(h[:, F:]))`; `F = cols` of the output.
#[cube(launch_unchecked)]
pub fn activation_forward_kernel(
    h: &Array<u32>,
    out: &mut Array<u32>,
    amax_out: &mut Array<Atomic<u32>>,
    rows: usize,
    cols: usize,
    alpha: f32,
    limit: f32,
    offset: f32,
    #[comptime] config: ActivationConfig,
) {
    let mut maxima = SharedMemory::<u32>::new(ACT_UNITS);
    let col = 2 * (CUBE_POS_X as usize * ACT_UNITS + UNIT_POS as usize);
    let first = CUBE_POS_Y as usize * ACT_BLOCK_ROWS;
    let end = select(first + ACT_BLOCK_ROWS < rows, first + ACT_BLOCK_ROWS, rows);
    let h_cols = if comptime![config.gated] { 2 * cols } else { cols };
    let mut local_amax = 0u32;
    if col < cols {
        let mut x = Array::<f32>::new(2 * ACT_ROW_STEP);
        let mut g = Array::<f32>::new(2 * ACT_ROW_STEP);
        for step in 0..ACT_STEPS {
            let row0 = first + step * ACT_ROW_STEP;
            load_row_pairs(h, &mut x, row0, end, h_cols, col, ACT_ROW_STEP, config.kind);
            if comptime![config.gated] {
                load_row_pairs(h, &mut g, row0, end, h_cols, cols + col, ACT_ROW_STEP, config.kind);
            }
            #[unroll]
            for i in 0..ACT_ROW_STEP {
                let row = row0 + i;
                if row < end {
                    let mut ya = act_value(x[2 * i], alpha, limit, config.act);
                    let mut yb = act_value(x[2 * i + 1], alpha, limit, config.act);
                    if comptime![config.gated] {
                        ya *= gate_value(g[2 * i], limit, offset, config.clamped_gate);
                        yb *= gate_value(g[2 * i + 1], limit, offset, config.clamped_gate);
                    }
                    store_pair(out, row * cols + col, ya, yb, config.kind);
                    if comptime![config.amax] {
                        local_amax = fold_amax(local_amax, ya, yb, config.kind);
                    }
                }
            }
        }
    }
    if comptime![config.amax] {
        cube_max_into(local_amax, &mut maxima, amax_out, 0usize, ACT_UNITS);
    }
}

/// `dh [rows, F']` from `dy [rows, F]` and `h [rows, F']` (`F' = 2F` when gated):
/// `dh = dy · act'(h)`, or for gated `dh[:, :F] = dy · gate · act'(x)`, `dh[:, F:] = dy · act(x) · gate'`.
#[cube(launch_unchecked)]
pub fn activation_backward_kernel(
    dy: &Array<u32>,
    h: &Array<u32>,
    dh: &mut Array<u32>,
    amax_out: &mut Array<Atomic<u32>>,
    dbias: &mut Array<f32>,
    rows: usize,
    cols: usize,
    alpha: f32,
    limit: f32,
    offset: f32,
    #[comptime] config: ActivationConfig,
) {
    let mut maxima = SharedMemory::<u32>::new(ACT_UNITS);
    let col = 2 * (CUBE_POS_X as usize * ACT_UNITS + UNIT_POS as usize);
    let block = CUBE_POS_Y as usize;
    let first = block * ACT_BLOCK_ROWS;
    let end = select(first + ACT_BLOCK_ROWS < rows, first + ACT_BLOCK_ROWS, rows);
    let h_cols = if comptime![config.gated] { 2 * cols } else { cols };
    let mut local_amax = 0u32;
    if col < cols {
        let mut sa = 0.0f32;
        let mut sb = 0.0f32;
        let mut sga = 0.0f32;
        let mut sgb = 0.0f32;
        let step_rows = comptime![backward_step_rows(config.gated)];
        let mut d = Array::<f32>::new(comptime![2 * step_rows]);
        let mut x = Array::<f32>::new(comptime![2 * step_rows]);
        let mut g = Array::<f32>::new(comptime![2 * step_rows]);
        for step in 0..comptime![ACT_BLOCK_ROWS / step_rows] {
            let row0 = first + step * step_rows;
            load_row_pairs(dy, &mut d, row0, end, cols, col, step_rows, config.kind);
            load_row_pairs(h, &mut x, row0, end, h_cols, col, step_rows, config.kind);
            if comptime![config.gated] {
                load_row_pairs(h, &mut g, row0, end, h_cols, cols + col, step_rows, config.kind);
            }
            #[unroll]
            for i in 0..step_rows {
                let row = row0 + i;
                if row < end {
                    let (da, db) = (d[2 * i], d[2 * i + 1]);
                    let (xa, xb) = (x[2 * i], x[2 * i + 1]);
                    if comptime![config.gated] {
                        let (ga, gb) = (g[2 * i], g[2 * i + 1]);
                        let dxa = da * gate_value(ga, limit, offset, config.clamped_gate)
                            * act_derivative(xa, alpha, limit, config.act);
                        let dxb = db * gate_value(gb, limit, offset, config.clamped_gate)
                            * act_derivative(xb, alpha, limit, config.act);
                        let dga = da * act_value(xa, alpha, limit, config.act)
                            * gate_derivative(ga, limit, config.clamped_gate);
                        let dgb = db * act_value(xb, alpha, limit, config.act)
                            * gate_derivative(gb, limit, config.clamped_gate);
                        store_pair(dh, row * h_cols + col, dxa, dxb, config.kind);
                        store_pair(dh, row * h_cols + cols + col, dga, dgb, config.kind);
                        if comptime![config.amax] {
                            local_amax = fold_amax(local_amax, dxa, dxb, config.kind);
                            local_amax = fold_amax(local_amax, dga, dgb, config.kind);
                        }
                        if comptime![config.dbias] {
                            sga += round_to(dga, config.kind);
                            sgb += round_to(dgb, config.kind);
                            sa += round_to(dxa, config.kind);
                            sb += round_to(dxb, config.kind);
                        }
                    } else {
                        let dxa = da * act_derivative(xa, alpha, limit, config.act);
                        let dxb = db * act_derivative(xb, alpha, limit, config.act);
                        store_pair(dh, row * h_cols + col, dxa, dxb, config.kind);
                        if comptime![config.amax] {
                            local_amax = fold_amax(local_amax, dxa, dxb, config.kind);
                        }
                        if comptime![config.dbias] {
                            sa += round_to(dxa, config.kind);
                            sb += round_to(dxb, config.kind);
                        }
                    }
                }
            }
        }
        if comptime![config.dbias] {
            dbias[block * h_cols + col] = sa;
            dbias[block * h_cols + col + 1] = sb;
            if comptime![config.gated] {
                dbias[block * h_cols + cols + col] = sga;
                dbias[block * h_cols + cols + col + 1] = sgb;
            }
        }
    }
    if comptime![config.amax] {
        cube_max_into(local_amax, &mut maxima, amax_out, 0usize, ACT_UNITS);
    }
}

fn act_grid(rows: usize, cols: usize) -> CubeCount {
    CubeCount::Static(
        (cols / 2).div_ceil(ACT_UNITS) as u32,
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

/// The activation's output `[rows, F]` in h's dtype, and its amax when `config.amax`.
pub fn activation_forward<R: Runtime>(
    client: &ComputeClient<R>,
    h: WordMatrix,
    params: ActivationParams,
    config: ActivationConfig,
) -> Result<(Handle, Option<Handle>), KernelError> {
    require_pairs(&h, "activation input")?;
    let cols = require_width(&h, config.gated)?;
    let out_matrix = WordMatrix {
        handle: h.handle,
        rows: h.rows,
        cols,
        kind: h.kind,
    };
    let out = client.empty(out_matrix.bytes());
    let amax = filled(client, 1, 0);
    unsafe {
        activation_forward_kernel::launch_unchecked::<R>(
            client,
            act_grid(h.rows, cols),
            CubeDim::new_1d(ACT_UNITS as u32),
            h.arg(),
            arg(&out, out_matrix.words()),
            arg(&amax, 1),
            h.rows,
            cols,
            params.alpha,
            params.limit,
            params.offset,
            config,
        )
    };
    Ok((out, config.amax.then_some(amax)))
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
    unsafe {
        activation_backward_kernel::launch_unchecked::<R>(
            client,
            act_grid(dy.rows, dy.cols),
            CubeDim::new_1d(ACT_UNITS as u32),
            dy.arg(),
            h_matrix.arg(),
            arg(&dh, h_matrix.words()),
            arg(&amax, 1),
            arg(&partials, if config.dbias { blocks * h_cols } else { 4 }),
            dy.rows,
            dy.cols,
            params.alpha,
            params.limit,
            params.offset,
            config,
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
