//! Combine: each token's k expert rows of the aligned batch weighted by the router and summed,
//! and the weighted sum's two gradients (one cube per output row, f32 arithmetic, rounded once).
//! The gradient with respect to the rows, which writes the whole aligned batch, moves a 16-byte
//! vector a unit where rows are whole vectors (the pair kernel wrote the fine-grained MoE's
//! `[65536, 2048]` bf16 at about 1.7 TB/s on an H200, 2026-11-28), the same values bit for bit.

use cubecl::prelude::*;
use cubecl::server::Handle;

use crate::routing::{require_pairs, ROW_UNITS};
use crate::util::buffers::arg;
use crate::util::elements::ElemKind;
use crate::util::error::KernelError;
use crate::util::grid::linear_cubes;
use crate::util::matrix::{WordMatrix, INPUT_VECTOR};
use crate::util::pairs::{load_pair, pair_word, store_pair, word_pair};
use crate::util::reduce::cube_sum;

/// `out[t] = Σ_j w[t·k + j] · y[assignment_row[t·k + j]]` (`w` = 1 when not `weighted`), in
/// f32, summed in j order, rounded once to y's type. One cube per token.
#[cube(launch_unchecked)]
pub fn combine_rows_kernel(
    y: &Array<u32>,
    weights: &Array<f32>,
    assignment_row: &Array<i32>,
    out: &mut Array<u32>,
    tokens: usize,
    k: usize,
    rows: usize,
    cols: usize,
    #[comptime] weighted: bool,
    #[comptime] kind: ElemKind,
) {
    let t = CUBE_POS as usize;
    if t < tokens {
        for c in range_stepped(2 * UNIT_POS as usize, cols, 2 * ROW_UNITS) {
            let mut s0 = 0.0f32;
            let mut s1 = 0.0f32;
            for j in 0..k {
                let row = usize::cast_from(assignment_row[t * k + j]);
                if row < rows {
                    let (v0, v1) = load_pair(y, row * cols + c, kind);
                    if weighted {
                        let w = weights[t * k + j];
                        s0 += w * v0;
                        s1 += w * v1;
                    } else {
                        s0 += v0;
                        s1 += v1;
                    }
                }
            }
            store_pair(out, t * cols + c, s0, s1, kind);
        }
    }
}

/// `[tokens, cols]` in y's type: each token's k rows of the aligned `y [rows, cols]` weighted
/// by f32 `weights [tokens, k]` (or summed when `weights` is `None`).
pub fn combine_rows<R: Runtime>(
    client: &ComputeClient<R>,
    y: WordMatrix,
    weights: Option<&Handle>,
    assignment_row: &Handle,
    tokens: usize,
    k: usize,
) -> Result<Handle, KernelError> {
    require_pairs("expert rows", y.rows, y.cols)?;
    let out_words = (tokens * y.cols * y.kind.bytes()).div_ceil(4);
    let out = client.empty(out_words.max(1) * 4);
    if tokens > 0 && y.cols > 0 {
        unsafe {
            combine_rows_kernel::launch_unchecked::<R>(
                client,
                linear_cubes(client, tokens),
                CubeDim::new_1d(ROW_UNITS as u32),
                y.arg(),
                arg(weights.unwrap_or(assignment_row), tokens * k),
                arg(assignment_row, tokens * k),
                arg(&out, out_words),
                tokens,
                k,
                y.rows,
                y.cols,
                weights.is_some(),
                y.kind,
            )
        };
    }
    Ok(out)
}

/// The gradient of `combine` with respect to `y`: aligned row r holding assignment a of token t
/// gets `w[a] · dout[t]` (rounded once to dout's type), rows without one get zeros. One cube per
/// aligned row.
#[cube(launch_unchecked)]
pub fn combine_rows_backward_kernel(
    dout: &Array<u32>,
    weights: &Array<f32>,
    row_assignment: &Array<i32>,
    dy: &mut Array<u32>,
    n: usize,
    k: usize,
    rows: usize,
    cols: usize,
    #[comptime] weighted: bool,
    #[comptime] kind: ElemKind,
) {
    let r = CUBE_POS as usize;
    if r < rows {
        let a = usize::cast_from(row_assignment[r]);
        let mut w = 1.0f32;
        if weighted {
            if a < n {
                w = weights[a];
            }
        }
        for c in range_stepped(2 * UNIT_POS as usize, cols, 2 * ROW_UNITS) {
            let mut d0 = 0.0f32;
            let mut d1 = 0.0f32;
            if a < n {
                let (g0, g1) = load_pair(dout, (a / k) * cols + c, kind);
                d0 = w * g0;
                d1 = w * g1;
            }
            store_pair(dy, r * cols + c, d0, d1, kind);
        }
    }
}


/// `combine_rows_backward_kernel` over 16-byte vectors (`vectors` a row): each element times the
/// weight in f32, rounded once, as the pair kernel.
#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
pub fn combine_rows_backward_vector_kernel<N: Size>(
    dout: &Array<Vector<u32, N>>,
    weights: &Array<f32>,
    row_assignment: &Array<i32>,
    dy: &mut Array<Vector<u32, N>>,
    n: usize,
    k: usize,
    rows: usize,
    vectors: usize,
    #[comptime] weighted: bool,
    #[comptime] kind: ElemKind,
) {
    let r = CUBE_POS as usize;
    if r < rows {
        let a = usize::cast_from(row_assignment[r]);
        let mut w = 1.0f32;
        if weighted {
            if a < n {
                w = weights[a];
            }
        }
        for v in range_stepped(UNIT_POS as usize, vectors, ROW_UNITS) {
            let mut packed = Vector::<u32, N>::empty();
            if a < n {
                let g = dout[(a / k) * vectors + v];
                #[unroll]
                for i in 0..INPUT_VECTOR {
                    if comptime![kind == ElemKind::F32] {
                        packed[i] = u32::reinterpret(w * f32::reinterpret(g[i]));
                    } else {
                        let (g0, g1) = word_pair(g[i], kind);
                        packed[i] = pair_word(w * g0, w * g1, kind);
                    }
                }
            } else {
                #[unroll]
                for i in 0..INPUT_VECTOR {
                    packed[i] = 0u32;
                }
            }
            dy[r * vectors + v] = packed;
        }
    }
}

/// `[rows, cols]` in dout's type: the gradient of `combine_rows` with respect to `y`.
pub fn combine_rows_backward<R: Runtime>(
    client: &ComputeClient<R>,
    dout: WordMatrix,
    weights: Option<&Handle>,
    row_assignment: &Handle,
    k: usize,
    rows: usize,
) -> Result<Handle, KernelError> {
    require_pairs("combined rows' gradient", dout.rows, dout.cols)?;
    let n = dout.rows * k;
    let out_words = (rows * dout.cols * dout.kind.bytes()).div_ceil(4);
    let out = client.empty(out_words.max(1) * 4);
    let row_bytes = dout.cols * dout.kind.bytes();
    if rows > 0 && row_bytes % 16 == 0 && dout.handle.offset_start.unwrap_or(0) % 16 == 0 {
        unsafe {
            combine_rows_backward_vector_kernel::launch_unchecked::<R>(
                client,
                linear_cubes(client, rows),
                CubeDim::new_1d(ROW_UNITS as u32),
                INPUT_VECTOR,
                dout.arg(),
                arg(weights.unwrap_or(row_assignment), n),
                arg(row_assignment, rows),
                arg(&out, out_words),
                n,
                k,
                rows,
                row_bytes / 16,
                weights.is_some(),
                dout.kind,
            )
        };
        return Ok(out);
    }
    if rows > 0 && dout.cols > 0 {
        unsafe {
            combine_rows_backward_kernel::launch_unchecked::<R>(
                client,
                linear_cubes(client, rows),
                CubeDim::new_1d(ROW_UNITS as u32),
                dout.arg(),
                arg(weights.unwrap_or(row_assignment), n),
                arg(row_assignment, rows),
                arg(&out, out_words),
                n,
                k,
                rows,
                dout.cols,
                weights.is_some(),
                dout.kind,
            )
        };
    }
    Ok(out)
}

/// The gradient of `combine` with respect to the weights: `dw[a] = Σ_c dout[t, c] · y[row, c]`
/// in f32 (0 for an assignment without a row). One cube per assignment.
#[cube(launch_unchecked)]
pub fn combine_weights_grad_kernel(
    dout: &Array<u32>,
    y: &Array<u32>,
    assignment_row: &Array<i32>,
    dw: &mut Array<f32>,
    n: usize,
    k: usize,
    rows: usize,
    cols: usize,
    #[comptime] kind: ElemKind,
) {
    let mut scratch = SharedMemory::<f32>::new(ROW_UNITS);
    let a = CUBE_POS as usize;
    let mut row = rows;
    if a < n {
        row = usize::cast_from(assignment_row[a]);
    }
    let mut local = 0.0f32;
    if row < rows {
        for c in range_stepped(2 * UNIT_POS as usize, cols, 2 * ROW_UNITS) {
            let (g0, g1) = load_pair(dout, (a / k) * cols + c, kind);
            let (v0, v1) = load_pair(y, row * cols + c, kind);
            local += g0 * v0 + g1 * v1;
        }
    }
    let dot = cube_sum(local, &mut scratch, ROW_UNITS);
    if a < n && UNIT_POS == 0 {
        dw[a] = dot;
    }
}

/// f32 `[tokens·k]`: the gradient of `combine_rows` with respect to its weights, from `dout
/// [tokens, cols]` and `y [rows, cols]` (same type).
pub fn combine_weights_grad<R: Runtime>(
    client: &ComputeClient<R>,
    dout: WordMatrix,
    y: &Handle,
    rows: usize,
    assignment_row: &Handle,
    k: usize,
) -> Result<Handle, KernelError> {
    require_pairs("combined rows' gradient", dout.rows, dout.cols)?;
    let n = dout.rows * k;
    let out = client.empty(n.max(1) * 4);
    if n > 0 {
        let y_words = (rows * dout.cols * dout.kind.bytes()).div_ceil(4);
        unsafe {
            combine_weights_grad_kernel::launch_unchecked::<R>(
                client,
                linear_cubes(client, n),
                CubeDim::new_1d(ROW_UNITS as u32),
                dout.arg(),
                arg(y, y_words),
                arg(assignment_row, n),
                arg(&out, n),
                n,
                k,
                rows,
                dout.cols,
                dout.kind,
            )
        };
    }
    Ok(out)
}
