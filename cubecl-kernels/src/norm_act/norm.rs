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

use crate::cast::codec::Fp8Encoder;
use crate::cast::kernel_choice::fp8_encoder;
use crate::norm_act::activation::{chunk_elements, chunk_words};
use crate::util::buffers::{arg, filled};
use crate::util::elements::ElemKind;
use crate::util::error::KernelError;
use crate::util::matrix::{require_pairs, WordMatrix};
use crate::util::pairs::{load_pair, packed_amax, stored_word, vector_element, word_elements};
use crate::util::partial_sums::column_partials_sum;
use crate::util::reduce::{cube_max_into, cube_sum, planes_of_32};

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

/// How a row kernel is compiled for one row width (chosen by the launcher, not the caller).
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub struct RowLayout {
    /// Words of a chunk (4, 2 or 1: one 16-byte access per chunk where the width allows); the
    /// kernels' vector size.
    pub words: usize,
    /// Chunks of a row each unit holds in registers: unit u holds chunks u, u + NORM_UNITS, ...
    pub per_unit: usize,
    /// Reductions by plane shuffles (`row_sum`).
    pub planes: bool,
    /// How stores round to a 16-bit dtype (`pairs::pair_word_by`).
    pub encoder: Fp8Encoder,
}

impl RowLayout {
    fn new<R: Runtime>(client: &ComputeClient<R>, cols: usize, kind: ElemKind) -> (Self, usize) {
        let words = chunk_words(cols, kind);
        let chunks = cols / chunk_elements(words, kind);
        let layout = RowLayout {
            words,
            per_unit: chunks.div_ceil(NORM_UNITS),
            planes: planes_of_32(client),
            encoder: fp8_encoder(client),
        };
        (layout, chunks)
    }
}

/// The unit's chunks of the row starting at chunk `row_chunk0` into `out[k]` (chunk
/// `unit + k · NORM_UNITS`, where it exists): loads only, all in flight together.
#[cube]
fn load_row<N: Size>(
    src: &Array<Vector<u32, N>>,
    row_chunk0: usize,
    chunks: usize,
    out: &mut Array<Vector<u32, N>>,
    #[comptime] per_unit: usize,
) {
    let unit = UNIT_POS as usize;
    #[unroll]
    for k in 0..per_unit {
        let c = unit + k * NORM_UNITS;
        if c < chunks {
            out[k] = src[row_chunk0 + c];
        }
    }
}

/// `γ` (plus 1 when stored zero-centred).
#[cube]
fn gamma_value(g: f32, #[comptime] config: NormConfig) -> f32 {
    let mut v = g;
    if comptime![config.zero_centered_gamma] {
        v += 1.0f32;
    }
    v
}

/// Planes of 32 units in a cube of `NORM_UNITS`.
const NORM_PLANES: usize = NORM_UNITS / 32;

/// Sum over the cube of every unit's `value`, returned to every unit. With `planes` (CUDA: planes
/// of 32, `planes_of_32`) each plane sums by shuffles, lane 0 writes the plane's sum into
/// `scratch[plane]`, and after one barrier every unit adds the planes' sums in plane order (so
/// every unit gets the same bits); `scratch` must not be written again before another barrier.
/// Without, `cube_sum`'s shared-memory tree (eight levels of barriers for 256 units).
#[cube]
fn row_sum(value: f32, scratch: &mut SharedMemory<f32>, #[comptime] planes: bool) -> f32 {
    let mut total = 0.0f32;
    if comptime![planes] {
        let s = plane_sum(value);
        let unit = UNIT_POS as usize;
        if unit % 32 == 0 {
            scratch[unit / 32] = s;
        }
        sync_cube();
        #[unroll]
        for p in 0..NORM_PLANES {
            total += scratch[p];
        }
    } else {
        total = cube_sum(value, scratch, NORM_UNITS);
    }
    total
}

/// `cube_max_into` (one atomic max a cube into `out[0]`), by plane shuffles with `planes` as
/// `row_sum`. A maximum does not depend on the order it is taken in: both forms give the same bits.
#[cube]
fn row_max_into(value: u32, scratch: &mut SharedMemory<u32>, out: &Array<Atomic<u32>>, #[comptime] planes: bool) {
    if comptime![planes] {
        let m = plane_max(value);
        let unit = UNIT_POS as usize;
        if unit % 32 == 0 {
            scratch[unit / 32] = m;
        }
        sync_cube();
        if unit == 0 {
            let mut total = 0u32;
            #[unroll]
            for p in 0..NORM_PLANES {
                total = max(total, scratch[p]);
            }
            out[0].fetch_max(total);
        }
    } else {
        cube_max_into(value, scratch, out, 0usize, NORM_UNITS);
    }
}

/// One row per cube; each unit holds its chunks of the row in registers (`RowLayout`), read once
/// with 16-byte loads where the width allows, and takes the mean, the variance and y from them.
/// The earlier form read the row three times in 4-byte words and reduced through an eight-level
/// shared-memory tree; Nsight Compute (H100, 8192 x 4096 bf16) found it issue-bound, 20 cycles
/// between a warp's instructions of which 7 waiting to be picked, at 44 % of DRAM bandwidth.
#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
pub fn norm_forward_kernel<N: Size>(
    input: &Array<Vector<u32, N>>,
    gamma: &Array<Vector<u32, N>>,
    beta: &Array<Vector<u32, N>>,
    output: &mut Array<Vector<u32, N>>,
    mean_out: &mut Array<f32>,
    rstd_out: &mut Array<f32>,
    amax_out: &mut Array<Atomic<u32>>,
    rows: usize,
    chunks: usize,
    cols: usize,
    eps: f32,
    #[comptime] config: NormConfig,
    #[comptime] layout: RowLayout,
) {
    // Separate scratch per reduction: `row_sum` with planes leaves its scratch unreusable.
    let mut sums = SharedMemory::<f32>::new(NORM_UNITS);
    let mut sums2 = SharedMemory::<f32>::new(NORM_UNITS);
    let mut maxima = SharedMemory::<u32>::new(NORM_UNITS);
    let row = CUBE_POS as usize;
    let per_word = comptime![word_elements(config.kind)];
    // Uniform per cube: the synchronizing reductions below run in every unit or in none.
    if row < rows {
        let unit = UNIT_POS as usize;
        let n = f32::cast_from(cols);
        let mut xs = Array::<Vector<u32, N>>::new(layout.per_unit);
        load_row::<N>(input, row * chunks, chunks, &mut xs, layout.per_unit);
        let mut mean = 0.0f32;
        if comptime![!config.rms] {
            let mut s = 0.0f32;
            #[unroll]
            for k in 0..layout.per_unit {
                if unit + k * NORM_UNITS < chunks {
                    #[unroll]
                    for w in 0..layout.words {
                        #[unroll]
                        for e in 0..per_word {
                            s += vector_element::<N>(xs[k], w, e, config.kind);
                        }
                    }
                }
            }
            mean = row_sum(s, &mut sums, layout.planes) / n;
        }
        // RMSNorm: mean stays 0, so this is mean(x²).
        let mut s2 = 0.0f32;
        #[unroll]
        for k in 0..layout.per_unit {
            if unit + k * NORM_UNITS < chunks {
                #[unroll]
                for w in 0..layout.words {
                    #[unroll]
                    for e in 0..per_word {
                        let d = vector_element::<N>(xs[k], w, e, config.kind) - mean;
                        s2 += d * d;
                    }
                }
            }
        }
        let var = row_sum(s2, &mut sums2, layout.planes) / n;
        let rstd = 1.0f32 / f32::sqrt(var + eps);
        if unit == 0 {
            mean_out[row] = mean;
            rstd_out[row] = rstd;
        }
        let mut local_amax = 0u32;
        #[unroll]
        for k in 0..layout.per_unit {
            let c = unit + k * NORM_UNITS;
            if c < chunks {
                let g = gamma[c];
                // β's chunk; without β it is never read, and γ's stands in for it.
                let mut b = g;
                if comptime![config.beta] {
                    b = beta[c];
                }
                let mut packed = Vector::<u32, N>::empty();
                #[unroll]
                for w in 0..layout.words {
                    let mut y = Array::<f32>::new(2usize);
                    y[1] = 0.0f32;
                    #[unroll]
                    for e in 0..per_word {
                        let x = vector_element::<N>(xs[k], w, e, config.kind);
                        let mut v = (x - mean) * rstd * gamma_value(vector_element::<N>(g, w, e, config.kind), config);
                        if comptime![config.beta] {
                            v += vector_element::<N>(b, w, e, config.kind);
                        }
                        y[e] = v;
                    }
                    packed[w] = stored_word(y[0], y[1], config.kind, layout.encoder);
                }
                output[row * chunks + c] = packed;
                if comptime![config.amax] {
                    // The amax of what is stored: the rounded values, read back from their bits.
                    local_amax = packed_amax::<N>(packed, local_amax, layout.words, config.kind);
                }
            }
        }
        if comptime![config.amax] {
            row_max_into(local_amax, &mut maxima, amax_out, layout.planes);
        }
    }
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
    let (layout, chunks) = RowLayout::new(client, x.cols, x.kind);
    unsafe {
        norm_forward_kernel::launch_unchecked::<R>(
            client,
            cubecl::server::CubeCountSelection::new(client, x.rows as u32).cube_count(),
            CubeDim::new_1d(NORM_UNITS as u32),
            layout.words,
            x.arg(),
            arg(gamma, vector),
            arg(beta.unwrap_or(gamma), vector),
            arg(&y, x.words()),
            arg(&mean, x.rows),
            arg(&rstd, x.rows),
            arg(&amax, 1),
            x.rows,
            chunks,
            x.cols,
            eps,
            config,
            layout,
        )
    };
    Ok(NormForwardOutput {
        y,
        mean,
        rstd,
        amax: config.amax.then_some(amax),
    })
}

/// dx of one row per cube: with `x̂ = (x - mean) · rstd` and `g = dy · γ`,
/// LayerNorm `dx = (g - x̂ · mean(g · x̂) - mean(g)) · rstd`, RMSNorm `dx = (g - x̂ · mean(g · x̂)) · rstd`.
/// dy, x and γ of the unit's chunks are read once into registers, as in `norm_forward_kernel`.
#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
pub fn norm_backward_kernel<N: Size>(
    dy: &Array<Vector<u32, N>>,
    input: &Array<Vector<u32, N>>,
    gamma: &Array<Vector<u32, N>>,
    mean: &Array<f32>,
    rstd: &Array<f32>,
    dx: &mut Array<Vector<u32, N>>,
    rows: usize,
    chunks: usize,
    cols: usize,
    #[comptime] config: NormConfig,
    #[comptime] layout: RowLayout,
) {
    let mut sums = SharedMemory::<f32>::new(NORM_UNITS);
    let mut sums2 = SharedMemory::<f32>::new(NORM_UNITS);
    let row = CUBE_POS as usize;
    let per_word = comptime![word_elements(config.kind)];
    if row < rows {
        let unit = UNIT_POS as usize;
        let n = f32::cast_from(cols);
        let mut ds = Array::<Vector<u32, N>>::new(layout.per_unit);
        let mut xs = Array::<Vector<u32, N>>::new(layout.per_unit);
        let mut gs = Array::<Vector<u32, N>>::new(layout.per_unit);
        load_row::<N>(dy, row * chunks, chunks, &mut ds, layout.per_unit);
        load_row::<N>(input, row * chunks, chunks, &mut xs, layout.per_unit);
        load_row::<N>(gamma, 0usize, chunks, &mut gs, layout.per_unit);
        let m = mean[row];
        let r = rstd[row];
        let mut s_gx = 0.0f32;
        let mut s_g = 0.0f32;
        #[unroll]
        for k in 0..layout.per_unit {
            if unit + k * NORM_UNITS < chunks {
                #[unroll]
                for w in 0..layout.words {
                    #[unroll]
                    for e in 0..per_word {
                        let gy = vector_element::<N>(ds[k], w, e, config.kind)
                            * gamma_value(vector_element::<N>(gs[k], w, e, config.kind), config);
                        s_gx += gy * ((vector_element::<N>(xs[k], w, e, config.kind) - m) * r);
                        s_g += gy;
                    }
                }
            }
        }
        let c1 = row_sum(s_gx, &mut sums, layout.planes) / n;
        let mut c2 = 0.0f32;
        if comptime![!config.rms] {
            c2 = row_sum(s_g, &mut sums2, layout.planes) / n;
        }
        #[unroll]
        for k in 0..layout.per_unit {
            let c = unit + k * NORM_UNITS;
            if c < chunks {
                let mut packed = Vector::<u32, N>::empty();
                #[unroll]
                for w in 0..layout.words {
                    let mut v = Array::<f32>::new(2usize);
                    v[1] = 0.0f32;
                    #[unroll]
                    for e in 0..per_word {
                        let d = vector_element::<N>(ds[k], w, e, config.kind);
                        let g = gamma_value(vector_element::<N>(gs[k], w, e, config.kind), config);
                        let x = vector_element::<N>(xs[k], w, e, config.kind);
                        v[e] = (d * g - (x - m) * r * c1 - c2) * r;
                    }
                    packed[w] = stored_word(v[0], v[1], config.kind, layout.encoder);
                }
                dx[row * chunks + c] = packed;
            }
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
    let (layout, chunks) = RowLayout::new(client, cols, dy.kind);
    unsafe {
        norm_backward_kernel::launch_unchecked::<R>(
            client,
            cubecl::server::CubeCountSelection::new(client, rows as u32).cube_count(),
            CubeDim::new_1d(NORM_UNITS as u32),
            layout.words,
            dy.arg(),
            arg(x, dy.words()),
            arg(gamma, (cols * dy.kind.bytes()).div_ceil(4)),
            arg(mean, rows),
            arg(rstd, rows),
            arg(&dx, dy.words()),
            rows,
            chunks,
            cols,
            config,
            layout,
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
