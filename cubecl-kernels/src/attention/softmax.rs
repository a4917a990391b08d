//! Attention's causal softmax in one pass each way, instead of Burn's decomposed attention (a
//! scale, the causal mask built from two aranges and filled in, max, subtract, exp, sum and
//! divide forward, each a launch, and their gradients backward). The scores are
//! `x [rows, seq]`: whole `[seq, seq]` blocks of query rows (a `[batch, heads, seq, seq]`
//! tensor, contiguous); row r is query position `q = r % seq` and sees keys `0..=q`.
//!
//! * forward: `p[c] = exp(s[c] - m) / Σ exp(s - m)` with `s = scale · x` over the visible keys,
//!   `m` their max, 0 for the masked keys;
//! * backward (the gradient with respect to `x`): `dx[c] = scale · p[c] · (dp[c] - Σ p · dp)`.
//!
//! One cube of 32 units per row; unit u takes the pairs u, u + 32, ... of the row in order, and
//! the units' partial maxima and sums meet in `cube_max_f32` / `cube_sum`'s fixed tree. The
//! arithmetic is f32 and the result is rounded to x's type once (Burn's decomposed version
//! rounds after every op in x's type).
//!
//! Rows that are whole 16-byte vectors (bf16 `seq % 8 == 0`, f32 `seq % 4 == 0`: every model
//! shape) take the vector kernels instead: a cube of 256 units holds 8 rows, one plane of 32
//! units each; unit u takes the vectors u, u + 32, ... of its row, reads only the vectors that
//! hold visible keys (half the scores of a causal block), and writes the masked ones as zeros
//! without reading them. The row's max and sums meet in the same 32-unit tree either way:
//! plane shuffles where planes are 32 wide (`plane_tree_max` / `plane_tree_sum`), shared memory
//! elsewhere. Rows of up to 128 vectors (1024 bf16 keys) take the forward's cached variant, which
//! holds each unit's scores in registers: one read and one exponential a key. The pair kernels
//! (32-unit cubes of 4-byte loads, every key read in the last pass)
//! ran at about a third of the H200's bandwidth (370 µs for `[131072, 1024]` bf16, 2026-11-28).

use crate::util::buffers::arg;
use crate::util::elements::ElemKind;
use crate::util::error::KernelError;
use crate::util::matrix::{WordMatrix, INPUT_VECTOR};
use crate::util::pairs::{load_pair, pair_word, store_pair, vector_element, word_elements};
use crate::util::reduce::{cube_max_f32, cube_sum, plane_tree_max, plane_tree_sum, planes_of_32};

use cubecl::prelude::*;
use cubecl::server::Handle;

/// Units per cube (one cube per row).
pub const SOFTMAX_UNITS: usize = 32;

/// The keys row `CUBE_POS` of `rows` sees: `0..row % seq + 1`; none for the extra cubes of a
/// launch (which still join the cube's reductions).
#[cube]
fn visible_keys(rows: usize, seq: usize) -> usize {
    let row = CUBE_POS as usize;
    let mut visible = 0usize;
    if row < rows {
        visible = row % seq + 1;
    }
    visible
}

/// Forward: `out` = the causal softmax of `scale · x` per row.
#[cube(launch_unchecked)]
pub fn causal_softmax_kernel(
    x: &Array<u32>,
    out: &mut Array<u32>,
    rows: usize,
    seq: usize,
    scale: f32,
    infinity: f32,
    #[comptime] kind: ElemKind,
) {
    let mut scratch = SharedMemory::<f32>::new(SOFTMAX_UNITS);
    let row = CUBE_POS as usize;
    let visible = visible_keys(rows, seq);
    let base = row * seq;
    let mut local_max = -infinity;
    for c in range_stepped(2 * UNIT_POS as usize, visible, 2 * SOFTMAX_UNITS) {
        let (a, b) = load_pair(x, base + c, kind);
        local_max = f32::max(local_max, a * scale);
        if c + 1 < visible {
            local_max = f32::max(local_max, b * scale);
        }
    }
    let m = cube_max_f32(local_max, &mut scratch, SOFTMAX_UNITS);
    let mut local_sum = 0.0f32;
    for c in range_stepped(2 * UNIT_POS as usize, visible, 2 * SOFTMAX_UNITS) {
        let (a, b) = load_pair(x, base + c, kind);
        local_sum += f32::exp(a * scale - m);
        if c + 1 < visible {
            local_sum += f32::exp(b * scale - m);
        }
    }
    let sum = cube_sum(local_sum, &mut scratch, SOFTMAX_UNITS);
    if row < rows {
        for c in range_stepped(2 * UNIT_POS as usize, seq, 2 * SOFTMAX_UNITS) {
            let (a, b) = load_pair(x, base + c, kind);
            let mut pa = 0.0f32;
            let mut pb = 0.0f32;
            if c < visible {
                pa = f32::exp(a * scale - m) / sum;
            }
            if c + 1 < visible {
                pb = f32::exp(b * scale - m) / sum;
            }
            store_pair(out, base + c, pa, pb, kind);
        }
    }
}

fn check(x: &WordMatrix) -> Result<(), KernelError> {
    let (rows, seq) = (x.rows, x.cols);
    if rows == 0 || seq == 0 || seq % 2 != 0 || rows % seq != 0 || rows * seq >= u32::MAX as usize {
        return Err(KernelError {
            value: format!("scores [{rows}, {seq}]"),
            rule: "causal softmax takes whole [seq, seq] blocks of query rows, seq even, fewer \
                   than 2^32 elements"
                .into(),
        });
    }
    Ok(())
}

/// The causal softmax of `scale · x` for scores `x [rows, seq]` (whole `[seq, seq]` blocks, seq
/// even): a new tensor in x's type.
pub fn causal_softmax<R: Runtime>(
    client: &ComputeClient<R>,
    x: WordMatrix,
    scale: f32,
) -> Result<Handle, KernelError> {
    check(&x)?;
    let out = client.empty(x.bytes());
    if whole_vectors(&x) {
        let (cubes, units, row_vectors) = vector_launch(client, &x);
        if row_vectors <= SOFTMAX_UNITS * CACHED_VECTORS {
            unsafe {
                causal_softmax_cached_kernel::launch_unchecked::<R>(
                    client,
                    cubes,
                    units,
                    INPUT_VECTOR,
                    x.arg(),
                    ArrayArg::from_raw_parts(out.clone(), x.words()),
                    x.rows,
                    x.cols,
                    row_vectors,
                    scale,
                    f32::INFINITY,
                    x.kind,
                    planes_of_32(client),
                )
            };
            return Ok(out);
        }
        unsafe {
            causal_softmax_vector_kernel::launch_unchecked::<R>(
                client,
                cubes,
                units,
                INPUT_VECTOR,
                x.arg(),
                ArrayArg::from_raw_parts(out.clone(), x.words()),
                x.rows,
                x.cols,
                row_vectors,
                scale,
                f32::INFINITY,
                x.kind,
                planes_of_32(client),
            )
        };
        return Ok(out);
    }
    unsafe {
        causal_softmax_kernel::launch_unchecked::<R>(
            client,
            cubecl::server::CubeCountSelection::new(client, x.rows as u32).cube_count(),
            CubeDim::new_1d(SOFTMAX_UNITS as u32),
            x.arg(),
            ArrayArg::from_raw_parts(out.clone(), x.words()),
            x.rows,
            x.cols,
            scale,
            f32::INFINITY,
            x.kind,
        )
    };
    Ok(out)
}

/// Backward: `out` = `scale · p · (dp - Σ p · dp)` per row (masked keys have p = 0 and get 0).
#[cube(launch_unchecked)]
pub fn causal_softmax_backward_kernel(
    p: &Array<u32>,
    dp: &Array<u32>,
    out: &mut Array<u32>,
    rows: usize,
    seq: usize,
    scale: f32,
    #[comptime] kind: ElemKind,
) {
    let mut scratch = SharedMemory::<f32>::new(SOFTMAX_UNITS);
    let row = CUBE_POS as usize;
    let visible = visible_keys(rows, seq);
    let base = row * seq;
    let mut local_dot = 0.0f32;
    for c in range_stepped(2 * UNIT_POS as usize, visible, 2 * SOFTMAX_UNITS) {
        let (pa, pb) = load_pair(p, base + c, kind);
        let (ga, gb) = load_pair(dp, base + c, kind);
        local_dot += pa * ga;
        if c + 1 < visible {
            local_dot += pb * gb;
        }
    }
    let dot = cube_sum(local_dot, &mut scratch, SOFTMAX_UNITS);
    if row < rows {
        for c in range_stepped(2 * UNIT_POS as usize, seq, 2 * SOFTMAX_UNITS) {
            let (pa, pb) = load_pair(p, base + c, kind);
            let (ga, gb) = load_pair(dp, base + c, kind);
            let mut da = 0.0f32;
            let mut db = 0.0f32;
            if c < visible {
                da = scale * (pa * (ga - dot));
            }
            if c + 1 < visible {
                db = scale * (pb * (gb - dot));
            }
            store_pair(out, base + c, da, db, kind);
        }
    }
}

/// The gradient of `causal_softmax` with respect to its scores, from its output `p` and the
/// output's gradient `dp` (same shape and type): a new tensor in that type.
pub fn causal_softmax_backward<R: Runtime>(
    client: &ComputeClient<R>,
    p: WordMatrix,
    dp: &Handle,
    scale: f32,
) -> Result<Handle, KernelError> {
    check(&p)?;
    let out = client.empty(p.bytes());
    if whole_vectors(&p) {
        let (cubes, units, row_vectors) = vector_launch(client, &p);
        unsafe {
            causal_softmax_backward_vector_kernel::launch_unchecked::<R>(
                client,
                cubes,
                units,
                INPUT_VECTOR,
                p.arg(),
                arg(dp, p.words()),
                ArrayArg::from_raw_parts(out.clone(), p.words()),
                p.rows,
                p.cols,
                row_vectors,
                scale,
                p.kind,
                planes_of_32(client),
            )
        };
        return Ok(out);
    }
    unsafe {
        causal_softmax_backward_kernel::launch_unchecked::<R>(
            client,
            cubecl::server::CubeCountSelection::new(client, p.rows as u32).cube_count(),
            CubeDim::new_1d(SOFTMAX_UNITS as u32),
            p.arg(),
            arg(dp, p.words()),
            ArrayArg::from_raw_parts(out.clone(), p.words()),
            p.rows,
            p.cols,
            scale,
            p.kind,
        )
    };
    Ok(out)
}

/// Rows a cube of the vector kernels holds, one plane of `SOFTMAX_UNITS` units each.
pub const SOFTMAX_ROWS_PER_CUBE: usize = 8;
const VECTOR_UNITS: usize = SOFTMAX_UNITS * SOFTMAX_ROWS_PER_CUBE;
/// Vectors a unit of `causal_softmax_cached_kernel` holds: rows of up to 128 vectors (1024 bf16
/// or 512 f32 keys).
const CACHED_VECTORS: usize = 4;

/// Whether the vector kernels take `x`: its rows are whole 16-byte vectors.
fn whole_vectors(x: &WordMatrix) -> bool {
    (x.cols * x.kind.bytes()) % (INPUT_VECTOR * 4) == 0
}

/// The vector kernels' cubes, cube shape and vectors a row.
fn vector_launch<R: Runtime>(
    client: &ComputeClient<R>,
    x: &WordMatrix,
) -> (CubeCount, CubeDim, usize) {
    let cubes = x.rows.div_ceil(SOFTMAX_ROWS_PER_CUBE) as u32;
    (
        cubecl::server::CubeCountSelection::new(client, cubes).cube_count(),
        CubeDim::new_1d(VECTOR_UNITS as u32),
        x.cols * x.kind.bytes() / (INPUT_VECTOR * 4),
    )
}

/// This unit's row of the vector kernels, its lane in the row's plane, and the keys it sees (none
/// for rows past `rows`, whose units still join the reductions).
#[cube]
fn vector_row(rows: usize, seq: usize) -> (usize, usize, usize) {
    let lane = UNIT_POS as usize % SOFTMAX_UNITS;
    let row = CUBE_POS as usize * SOFTMAX_ROWS_PER_CUBE + UNIT_POS as usize / SOFTMAX_UNITS;
    let mut visible = 0usize;
    if row < rows {
        visible = row % seq + 1;
    }
    (row, lane, visible)
}

/// Sum over the 32 units of this unit's row, returned to all of them: the tree of
/// `plane_tree_sum` (unit i adds unit i + stride), by shuffles (`planes`) or through the row's
/// 32 entries of `scratch` (`segment_sum`). Every unit of the cube must call it.
#[cube]
fn row_sum(value: f32, scratch: &mut SharedMemory<f32>, #[comptime] planes: bool) -> f32 {
    if comptime![planes] {
        plane_tree_sum(value)
    } else {
        segment_sum(value, scratch)
    }
}

/// `row_sum`'s max (never NaN in, as `cube_max_f32`).
#[cube]
fn row_max(value: f32, scratch: &mut SharedMemory<f32>, #[comptime] planes: bool) -> f32 {
    if comptime![planes] {
        plane_tree_max(value)
    } else {
        segment_max(value, scratch)
    }
}

/// `plane_tree_sum` through shared memory, each row in its own 32 entries: it synchronizes the
/// cube, also before returning, so `scratch` can be reused at once.
#[cube]
fn segment_sum(value: f32, scratch: &mut SharedMemory<f32>) -> f32 {
    let unit = UNIT_POS as usize;
    let lane = unit % SOFTMAX_UNITS;
    scratch[unit] = value;
    sync_cube();
    #[unroll]
    for level in 0..5u32 {
        let stride = comptime![16usize >> level];
        if lane < stride {
            scratch[unit] = scratch[unit] + scratch[unit + stride];
        }
        sync_cube();
    }
    let total = scratch[unit - lane];
    sync_cube();
    total
}

/// `plane_tree_max` through shared memory, as `segment_sum`.
#[cube]
fn segment_max(value: f32, scratch: &mut SharedMemory<f32>) -> f32 {
    let unit = UNIT_POS as usize;
    let lane = unit % SOFTMAX_UNITS;
    scratch[unit] = value;
    sync_cube();
    #[unroll]
    for level in 0..5u32 {
        let stride = comptime![16usize >> level];
        if lane < stride {
            let other = scratch[unit + stride];
            if other > scratch[unit] {
                scratch[unit] = other;
            }
        }
        sync_cube();
    }
    let total = scratch[unit - lane];
    sync_cube();
    total
}

/// Forward over 16-byte vectors: `out` = the causal softmax of `scale · x` per row
/// (`row_vectors` vectors a row).
#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
pub fn causal_softmax_vector_kernel<N: Size>(
    x: &Array<Vector<u32, N>>,
    out: &mut Array<Vector<u32, N>>,
    rows: usize,
    seq: usize,
    row_vectors: usize,
    scale: f32,
    infinity: f32,
    #[comptime] kind: ElemKind,
    #[comptime] planes: bool,
) {
    let mut scratch = SharedMemory::<f32>::new(VECTOR_UNITS);
    let (row, lane, visible) = vector_row(rows, seq);
    let per_word = comptime![word_elements(kind)];
    let per_vector = comptime![INPUT_VECTOR * word_elements(kind)];
    let visible_vectors = (visible + per_vector - 1) / per_vector;
    let base = row * row_vectors;
    let mut local_max = -infinity;
    for v in range_stepped(lane, visible_vectors, SOFTMAX_UNITS) {
        let words = x[base + v];
        #[unroll]
        for w in 0..INPUT_VECTOR {
            #[unroll]
            for e in 0..per_word {
                if v * per_vector + w * per_word + e < visible {
                    local_max = f32::max(local_max, vector_element::<N>(words, w, e, kind) * scale);
                }
            }
        }
    }
    let m = row_max(local_max, &mut scratch, planes);
    let mut local_sum = 0.0f32;
    for v in range_stepped(lane, visible_vectors, SOFTMAX_UNITS) {
        let words = x[base + v];
        #[unroll]
        for w in 0..INPUT_VECTOR {
            #[unroll]
            for e in 0..per_word {
                if v * per_vector + w * per_word + e < visible {
                    local_sum += f32::exp(vector_element::<N>(words, w, e, kind) * scale - m);
                }
            }
        }
    }
    let sum = row_sum(local_sum, &mut scratch, planes);
    if row < rows {
        for v in range_stepped(lane, row_vectors, SOFTMAX_UNITS) {
            let mut packed = Vector::<u32, N>::empty();
            #[unroll]
            for w in 0..INPUT_VECTOR {
                packed[w] = 0u32;
            }
            if v < visible_vectors {
                let words = x[base + v];
                #[unroll]
                for w in 0..INPUT_VECTOR {
                    let c = v * per_vector + w * per_word;
                    let mut pa = 0.0f32;
                    let mut pb = 0.0f32;
                    if c < visible {
                        pa =
                            f32::exp(vector_element::<N>(words, w, 0usize, kind) * scale - m) / sum;
                    }
                    if comptime![kind == ElemKind::F32] {
                        packed[w] = u32::reinterpret(pa);
                    } else {
                        if c + 1 < visible {
                            pb = f32::exp(vector_element::<N>(words, w, 1usize, kind) * scale - m)
                                / sum;
                        }
                        packed[w] = pair_word(pa, pb, kind);
                    }
                }
            }
            out[base + v] = packed;
        }
    }
}

/// `causal_softmax_vector_kernel` for rows of at most `32 · CACHED_VECTORS` vectors, each unit's
/// scaled scores held in registers: one read of the visible keys and one exponential a key,
/// where the vector kernel reads them three times and takes two. The same sums in the same
/// order; the scaled score is rounded to f32 before the max is subtracted, where the compiler may
/// fuse the vector kernel's multiply and subtract, so values can differ in the last bit. On an
/// H200 (2026-11-28) it ran the fine-grained step's `[131072, 1024]` bf16 forward in 199 µs,
/// where the vector kernel had taken 212 in an earlier call: what bounds it is not the reads.
#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
pub fn causal_softmax_cached_kernel<N: Size>(
    x: &Array<Vector<u32, N>>,
    out: &mut Array<Vector<u32, N>>,
    rows: usize,
    seq: usize,
    row_vectors: usize,
    scale: f32,
    infinity: f32,
    #[comptime] kind: ElemKind,
    #[comptime] planes: bool,
) {
    let mut scratch = SharedMemory::<f32>::new(VECTOR_UNITS);
    let (row, lane, visible) = vector_row(rows, seq);
    let per_word = comptime![word_elements(kind)];
    let per_vector = comptime![INPUT_VECTOR * word_elements(kind)];
    let visible_vectors = (visible + per_vector - 1) / per_vector;
    let base = row * row_vectors;
    // Unit-local vector i is the row's vector lane + 32 · i; its element j at i · per_vector + j.
    let mut held = Array::<f32>::new(comptime![CACHED_VECTORS * INPUT_VECTOR * word_elements(kind)]);
    let mut local_max = -infinity;
    #[unroll]
    for i in 0..CACHED_VECTORS {
        let v = lane + i * SOFTMAX_UNITS;
        if v < visible_vectors {
            let words = x[base + v];
            #[unroll]
            for w in 0..INPUT_VECTOR {
                #[unroll]
                for e in 0..per_word {
                    let s = vector_element::<N>(words, w, e, kind) * scale;
                    held[i * per_vector + w * per_word + e] = s;
                    if v * per_vector + w * per_word + e < visible {
                        local_max = f32::max(local_max, s);
                    }
                }
            }
        }
    }
    let m = row_max(local_max, &mut scratch, planes);
    let mut local_sum = 0.0f32;
    #[unroll]
    for i in 0..CACHED_VECTORS {
        let v = lane + i * SOFTMAX_UNITS;
        if v < visible_vectors {
            #[unroll]
            for w in 0..INPUT_VECTOR {
                #[unroll]
                for e in 0..per_word {
                    let j = i * per_vector + w * per_word + e;
                    if v * per_vector + w * per_word + e < visible {
                        let p = f32::exp(held[j] - m);
                        held[j] = p;
                        local_sum += p;
                    }
                }
            }
        }
    }
    let sum = row_sum(local_sum, &mut scratch, planes);
    if row < rows {
        #[unroll]
        for i in 0..CACHED_VECTORS {
            let v = lane + i * SOFTMAX_UNITS;
            if v < row_vectors {
                let mut packed = Vector::<u32, N>::empty();
                #[unroll]
                for w in 0..INPUT_VECTOR {
                    packed[w] = 0u32;
                }
                if v < visible_vectors {
                    #[unroll]
                    for w in 0..INPUT_VECTOR {
                        let c = v * per_vector + w * per_word;
                        let j = i * per_vector + w * per_word;
                        let mut pa = 0.0f32;
                        let mut pb = 0.0f32;
                        if c < visible {
                            pa = held[j] / sum;
                        }
                        if comptime![kind == ElemKind::F32] {
                            packed[w] = u32::reinterpret(pa);
                        } else {
                            if c + 1 < visible {
                                pb = held[j + 1] / sum;
                            }
                            packed[w] = pair_word(pa, pb, kind);
                        }
                    }
                }
                out[base + v] = packed;
            }
        }
    }
}

/// Backward over 16-byte vectors: `out` = `scale · p · (dp - Σ p · dp)` per row (masked keys get 0
/// without being read).
#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
pub fn causal_softmax_backward_vector_kernel<N: Size>(
    p: &Array<Vector<u32, N>>,
    dp: &Array<Vector<u32, N>>,
    out: &mut Array<Vector<u32, N>>,
    rows: usize,
    seq: usize,
    row_vectors: usize,
    scale: f32,
    #[comptime] kind: ElemKind,
    #[comptime] planes: bool,
) {
    let mut scratch = SharedMemory::<f32>::new(VECTOR_UNITS);
    let (row, lane, visible) = vector_row(rows, seq);
    let per_word = comptime![word_elements(kind)];
    let per_vector = comptime![INPUT_VECTOR * word_elements(kind)];
    let visible_vectors = (visible + per_vector - 1) / per_vector;
    let base = row * row_vectors;
    let mut local_dot = 0.0f32;
    for v in range_stepped(lane, visible_vectors, SOFTMAX_UNITS) {
        let pw = p[base + v];
        let gw = dp[base + v];
        #[unroll]
        for w in 0..INPUT_VECTOR {
            #[unroll]
            for e in 0..per_word {
                if v * per_vector + w * per_word + e < visible {
                    local_dot +=
                        vector_element::<N>(pw, w, e, kind) * vector_element::<N>(gw, w, e, kind);
                }
            }
        }
    }
    let dot = row_sum(local_dot, &mut scratch, planes);
    if row < rows {
        for v in range_stepped(lane, row_vectors, SOFTMAX_UNITS) {
            let mut packed = Vector::<u32, N>::empty();
            #[unroll]
            for w in 0..INPUT_VECTOR {
                packed[w] = 0u32;
            }
            if v < visible_vectors {
                let pw = p[base + v];
                let gw = dp[base + v];
                #[unroll]
                for w in 0..INPUT_VECTOR {
                    let c = v * per_vector + w * per_word;
                    let mut da = 0.0f32;
                    let mut db = 0.0f32;
                    if c < visible {
                        da = scale
                            * (vector_element::<N>(pw, w, 0usize, kind)
                                * (vector_element::<N>(gw, w, 0usize, kind) - dot));
                    }
                    if comptime![kind == ElemKind::F32] {
                        packed[w] = u32::reinterpret(da);
                    } else {
                        if c + 1 < visible {
                            db = scale
                                * (vector_element::<N>(pw, w, 1usize, kind)
                                    * (vector_element::<N>(gw, w, 1usize, kind) - dot));
                        }
                        packed[w] = pair_word(da, db, kind);
                    }
                }
            }
            out[base + v] = packed;
        }
    }
}
