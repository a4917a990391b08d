//! LayerNorm / RMSNorm over the rows of `x [rows, cols]` for LayerNormMLP, forward and backward,
//! with the launchers beside the kernels.
//!
//! Forward: one cube per row computes the mean (LayerNorm) and `rstd = 1 / sqrt(var + eps)` in f32
//! with a fixed reduction order, writes `y = (x - mean) · rstd · γ (+ β)` in x's dtype, saves mean
//! and rstd, and can take the amax of the stored `y` for the FP8 current-scaling quantizer that
//! reads it next, which then skips its own amax pass (`TensorScaling::CurrentFromAmax`).
//! Backward: one cube per row writes dx; dγ and dβ are column sums over rows, taken in blocks of
//! `NORM_BLOCK_ROWS` rows by (block, column pair) units and then summed over blocks
//! (`column_partials_sum`): no thread walks every row, which is what makes Burn's `sum_dim(0)`
//! slow on tall matrices (`src/ops/row_reduce.rs`).

use cubecl::prelude::*;
use cubecl::server::Handle;

use crate::codec::{abs_bits_for_amax, ElemKind};
use crate::launch::{filled, KernelError};
use crate::pairs::{load_pair, round_to, store_pair};
use crate::partial_sums::column_partials_sum;
use crate::reduce::{cube_max_into, cube_sum};

/// Units per cube of the row kernels.
pub const NORM_UNITS: usize = 256;
/// Rows per block of the dγ / dβ partial sums.
pub const NORM_BLOCK_ROWS: usize = 64;

#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub struct NormConfig {
    /// dtype of x, γ, β, y, dy and dx.
    pub kind: ElemKind,
    /// RMSNorm (no mean, no β) rather than LayerNorm.
    pub rms: bool,
    /// γ is stored as γ - 1.
    pub zero_centered_gamma: bool,
    /// LayerNorm with a β.
    pub beta: bool,
    /// Record the amax of the stored y (atomic max into `amax_out[0]`).
    pub amax: bool,
}

#[cube]
fn gamma_pair(gamma: &Array<u32>, col: usize, #[comptime] config: NormConfig) -> (f32, f32) {
    let (mut ga, mut gb) = load_pair(gamma, col, config.kind);
    if comptime![config.zero_centered_gamma] {
        ga += 1.0f32;
        gb += 1.0f32;
    }
    (ga, gb)
}

#[cube(launch_unchecked)]
pub fn norm_forward_kernel(
    input: &Array<u32>,
    gamma: &Array<u32>,
    beta: &Array<u32>,
    output: &mut Array<u32>,
    mean_out: &mut Array<f32>,
    rstd_out: &mut Array<f32>,
    amax_out: &mut Array<Atomic<u32>>,
    rows: usize,
    cols: usize,
    eps: f32,
    #[comptime] config: NormConfig,
) {
    let mut sums = SharedMemory::<f32>::new(NORM_UNITS);
    let mut maxima = SharedMemory::<u32>::new(NORM_UNITS);
    let row = CUBE_POS as usize;
    // Uniform per cube: the synchronizing reductions below run in every unit or in none.
    if row < rows {
        let unit = UNIT_POS as usize;
        let pairs = cols / 2;
        let base = row * cols;
        let n = f32::cast_from(cols);
        let mut mean = 0.0f32;
        if comptime![!config.rms] {
            let mut s = 0.0f32;
            for p in range_stepped(unit, pairs, NORM_UNITS) {
                let (a, b) = load_pair(input, base + 2 * p, config.kind);
                s += a;
                s += b;
            }
            mean = cube_sum(s, &mut sums, NORM_UNITS) / n;
        }
        // RMSNorm: mean stays 0, so this is mean(x²).
        let mut s2 = 0.0f32;
        for p in range_stepped(unit, pairs, NORM_UNITS) {
            let (a, b) = load_pair(input, base + 2 * p, config.kind);
            let da = a - mean;
            let db = b - mean;
            s2 += da * da;
            s2 += db * db;
        }
        let var = cube_sum(s2, &mut sums, NORM_UNITS) / n;
        let rstd = 1.0f32 / f32::sqrt(var + eps);
        if unit == 0 {
            mean_out[row] = mean;
            rstd_out[row] = rstd;
        }
        let mut local_amax = 0u32;
        for p in range_stepped(unit, pairs, NORM_UNITS) {
            let col = 2 * p;
            let (a, b) = load_pair(input, base + col, config.kind);
            let (ga, gb) = gamma_pair(gamma, col, config);
            let mut ya = (a - mean) * rstd * ga;
            let mut yb = (b - mean) * rstd * gb;
            if comptime![config.beta] {
                let (ba, bb) = load_pair(beta, col, config.kind);
                ya += ba;
                yb += bb;
            }
            store_pair(output, base + col, ya, yb, config.kind);
            if comptime![config.amax] {
                let ma = abs_bits_for_amax(round_to(ya, config.kind));
                let mb = abs_bits_for_amax(round_to(yb, config.kind));
                local_amax = select(ma > local_amax, ma, local_amax);
                local_amax = select(mb > local_amax, mb, local_amax);
            }
        }
        if comptime![config.amax] {
            cube_max_into(local_amax, &mut maxima, amax_out, 0usize, NORM_UNITS);
        }
    }
}

/// dx of one row per cube: with `x̂ = (x - mean) · rstd` and `g = dy · γ`,
/// LayerNorm `dx = (g - x̂ · mean(g · x̂) - mean(g)) · rstd`, RMSNorm `dx = (g - x̂ · mean(g · x̂)) · rstd`.
#[cube(launch_unchecked)]
pub fn norm_backward_kernel(
    dy: &Array<u32>,
    input: &Array<u32>,
    gamma: &Array<u32>,
    mean: &Array<f32>,
    rstd: &Array<f32>,
    dx: &mut Array<u32>,
    rows: usize,
    cols: usize,
    #[comptime] config: NormConfig,
) {
    let mut sums = SharedMemory::<f32>::new(NORM_UNITS);
    let row = CUBE_POS as usize;
    if row < rows {
        let unit = UNIT_POS as usize;
        let pairs = cols / 2;
        let base = row * cols;
        let n = f32::cast_from(cols);
        let m = mean[row];
        let r = rstd[row];
        let mut s_gx = 0.0f32;
        let mut s_g = 0.0f32;
        for p in range_stepped(unit, pairs, NORM_UNITS) {
            let col = 2 * p;
            let (da, db) = load_pair(dy, base + col, config.kind);
            let (xa, xb) = load_pair(input, base + col, config.kind);
            let (ga, gb) = gamma_pair(gamma, col, config);
            let gya = da * ga;
            let gyb = db * gb;
            s_gx += gya * ((xa - m) * r);
            s_gx += gyb * ((xb - m) * r);
            s_g += gya;
            s_g += gyb;
        }
        let c1 = cube_sum(s_gx, &mut sums, NORM_UNITS) / n;
        let mut c2 = 0.0f32;
        if comptime![!config.rms] {
            c2 = cube_sum(s_g, &mut sums, NORM_UNITS) / n;
        }
        for p in range_stepped(unit, pairs, NORM_UNITS) {
            let col = 2 * p;
            let (da, db) = load_pair(dy, base + col, config.kind);
            let (xa, xb) = load_pair(input, base + col, config.kind);
            let (ga, gb) = gamma_pair(gamma, col, config);
            let dxa = (da * ga - (xa - m) * r * c1 - c2) * r;
            let dxb = (db * gb - (xb - m) * r * c1 - c2) * r;
            store_pair(dx, base + col, dxa, dxb, config.kind);
        }
    }
}

/// Partial dγ (`Σ dy · x̂`) and dβ (`Σ dy`) over one block of rows per cube row, f32
/// `[blocks, cols]`; a unit owns one column pair.
#[cube(launch_unchecked)]
pub fn norm_param_partials_kernel(
    dy: &Array<u32>,
    input: &Array<u32>,
    mean: &Array<f32>,
    rstd: &Array<f32>,
    dgamma: &mut Array<f32>,
    dbeta: &mut Array<f32>,
    rows: usize,
    cols: usize,
    #[comptime] config: NormConfig,
) {
    let p = CUBE_POS_X as usize * NORM_UNITS + UNIT_POS as usize;
    let block = CUBE_POS_Y as usize;
    let col = 2 * p;
    if col < cols {
        let first = block * NORM_BLOCK_ROWS;
        let end = select(first + NORM_BLOCK_ROWS < rows, first + NORM_BLOCK_ROWS, rows);
        let mut ga = 0.0f32;
        let mut gb = 0.0f32;
        let mut ba = 0.0f32;
        let mut bb = 0.0f32;
        for row in first..end {
            let (da, db) = load_pair(dy, row * cols + col, config.kind);
            let (xa, xb) = load_pair(input, row * cols + col, config.kind);
            let m = mean[row];
            let r = rstd[row];
            ga += da * ((xa - m) * r);
            gb += db * ((xb - m) * r);
            ba += da;
            bb += db;
        }
        dgamma[block * cols + col] = ga;
        dgamma[block * cols + col + 1] = gb;
        if comptime![config.beta] {
            dbeta[block * cols + col] = ba;
            dbeta[block * cols + col + 1] = bb;
        }
    }
}

/// A contiguous row-major matrix of raw words in device memory (LayerNormMLP kernels).
#[derive(Clone, Copy)]
pub struct WordMatrix<'a> {
    pub handle: &'a Handle,
    pub rows: usize,
    pub cols: usize,
    pub kind: ElemKind,
}

impl WordMatrix<'_> {
    pub(crate) fn words(&self) -> usize {
        (self.rows * self.cols * self.kind.bytes()).div_ceil(4)
    }

    pub(crate) fn bytes(&self) -> usize {
        self.rows * self.cols * self.kind.bytes()
    }

    pub(crate) fn arg<R: Runtime>(&self) -> ArrayArg<R> {
        arg(self.handle, self.words())
    }
}

pub(crate) fn arg<R: Runtime>(handle: &Handle, words: usize) -> ArrayArg<R> {
    unsafe { ArrayArg::from_raw_parts(handle.clone(), words.max(1)) }
}

pub(crate) fn require_pairs(x: &WordMatrix, what: &str) -> Result<(), KernelError> {
    if x.rows == 0 || x.cols == 0 || x.cols % 2 != 0 || x.rows * x.cols >= u32::MAX as usize {
        return Err(KernelError {
            value: format!("{what} [{}, {}]", x.rows, x.cols),
            rule: "LayerNormMLP kernels take non-empty matrices with an even number of columns \
                   and fewer than 2^32 elements"
                .to_string(),
        });
    }
    Ok(())
}

/// What the norm forward kernel writes.
pub struct NormForwardOutput {
    /// y in x's dtype, `[rows, cols]`.
    pub y: Handle,
    /// f32 `[rows]` (zeros for RMSNorm).
    pub mean: Handle,
    /// f32 `[rows]`.
    pub rstd: Handle,
    /// f32 bits of `max |y|`, when asked for.
    pub amax: Option<Handle>,
}

/// `y = norm(x) · γ (+ β)`; `gamma` and `beta` are `[cols]` in x's dtype (`beta` for LayerNorm).
pub fn norm_forward<R: Runtime>(
    client: &ComputeClient<R>,
    x: WordMatrix,
    gamma: &Handle,
    beta: Option<&Handle>,
    eps: f32,
    config: NormConfig,
) -> Result<NormForwardOutput, KernelError> {
    require_pairs(&x, "norm input")?;
    let y = client.empty(x.bytes());
    let mean = client.empty(4 * x.rows);
    let rstd = client.empty(4 * x.rows);
    let amax = filled(client, 1, 0);
    let vector = (x.cols * x.kind.bytes()).div_ceil(4);
    let config = NormConfig {
        beta: beta.is_some() && !config.rms,
        ..config
    };
    unsafe {
        norm_forward_kernel::launch_unchecked::<R>(
            client,
            cubecl::server::CubeCountSelection::new(client, x.rows as u32).cube_count(),
            CubeDim::new_1d(NORM_UNITS as u32),
            x.arg(),
            arg(gamma, vector),
            arg(beta.unwrap_or(gamma), vector),
            arg(&y, x.words()),
            arg(&mean, x.rows),
            arg(&rstd, x.rows),
            arg(&amax, 1),
            x.rows,
            x.cols,
            eps,
            config,
        )
    };
    Ok(NormForwardOutput {
        y,
        mean,
        rstd,
        amax: config.amax.then_some(amax),
    })
}

/// What the norm backward kernels write.
pub struct NormBackwardOutput {
    /// dx in x's dtype.
    pub dx: Handle,
    /// f32 `[cols]`.
    pub dgamma: Handle,
    /// f32 `[cols]` (LayerNorm with β only).
    pub dbeta: Option<Handle>,
}

/// dx, dγ and dβ from dy, x and the forward's mean and rstd.
pub fn norm_backward<R: Runtime>(
    client: &ComputeClient<R>,
    dy: WordMatrix,
    x: &Handle,
    gamma: &Handle,
    mean: &Handle,
    rstd: &Handle,
    config: NormConfig,
) -> Result<NormBackwardOutput, KernelError> {
    require_pairs(&dy, "norm grad_output")?;
    let (rows, cols) = (dy.rows, dy.cols);
    let config = NormConfig {
        beta: config.beta && !config.rms,
        ..config
    };
    let dx = client.empty(dy.bytes());
    unsafe {
        norm_backward_kernel::launch_unchecked::<R>(
            client,
            cubecl::server::CubeCountSelection::new(client, rows as u32).cube_count(),
            CubeDim::new_1d(NORM_UNITS as u32),
            dy.arg(),
            arg(x, dy.words()),
            arg(gamma, (cols * dy.kind.bytes()).div_ceil(4)),
            arg(mean, rows),
            arg(rstd, rows),
            arg(&dx, dy.words()),
            rows,
            cols,
            config,
        )
    };
    let blocks = rows.div_ceil(NORM_BLOCK_ROWS);
    let partial_gamma = client.empty(4 * blocks * cols);
    let partial_beta = if config.beta {
        client.empty(4 * blocks * cols)
    } else {
        client.empty(16)
    };
    unsafe {
        norm_param_partials_kernel::launch_unchecked::<R>(
            client,
            CubeCount::Static(
                (cols / 2).div_ceil(NORM_UNITS) as u32,
                blocks as u32,
                1,
            ),
            CubeDim::new_1d(NORM_UNITS as u32),
            dy.arg(),
            arg(x, dy.words()),
            arg(mean, rows),
            arg(rstd, rows),
            arg(&partial_gamma, blocks * cols),
            arg(&partial_beta, if config.beta { blocks * cols } else { 4 }),
            rows,
            cols,
            config,
        )
    };
    let dgamma = column_partials_sum(client, &partial_gamma, blocks, cols);
    let dbeta = config
        .beta
        .then(|| column_partials_sum(client, &partial_beta, blocks, cols));
    Ok(NormBackwardOutput { dx, dgamma, dbeta })
}
