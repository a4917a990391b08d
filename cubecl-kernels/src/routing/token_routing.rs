//! An MoE layer's token routing on the device, in a handful of launches instead of some forty
//! Burn tensor ops per layer: the router's top-k choice, a stable counting sort of the `T·k`
//! assignments by expert (every assignment's position in the packed batch, and the experts' token
//! counts, the grouped GEMMs' `m_splits`), every assignment's row in the experts' aligned batch,
//! and the moves of token rows into that batch (dispatch, a row gather elsewhere) and back
//! (combine: each token's k expert rows weighted by the router and summed in f32).
//!
//! Assignment `a = t·k + j` is token t's j-th choice. Host references:
//! `burn_lowp::ops::token_routing` (Burn tensor ops, the default of every other backend).
//!
//! * `top_k_kernel`: one unit per token; round j picks the largest score not yet picked, ties to
//!   the lower expert (as k rounds of argmax with the picked ones masked out).
//! * `chunk_rank_kernel`: cube c takes assignments `c·256 ..`: each one's rank among the chunk's
//!   earlier assignments of its expert, and the chunk's count per expert.
//! * `chunk_scan_kernel` (one cube): per expert, the counts of the chunks before each chunk
//!   (in place), the expert's total (`m_splits`) and its first packed position.
//! * `expert_position_kernel`: `position[a] = start[e] + before[chunk][e] + rank[a]`.
//! * `route_rows_kernel`: with the aligned layout (`group_layout`) made from those `m_splits`:
//!   `assignment_row[a] = packed_to_aligned[position[a]]`, and the inverse per aligned row
//!   (`row_assignment`, `row_token`), `n` / `T` for rows that hold no token.
//! * `combine_rows_kernel`, `combine_rows_backward_kernel`, `combine_weights_grad_kernel`: the
//!   weighted sum and its two gradients (one cube per output row, f32 arithmetic, rounded once).
//!
//! Expert indices are the top-k kernel's, in `0..experts`; an index outside that range is not
//! counted and its assignment gets row `rows` (nothing reads or writes it), so a bad index can
//! never send a kernel out of bounds.

use crate::util::buffers::arg;
use crate::util::elements::ElemKind;
use crate::util::error::KernelError;
use crate::util::grid::linear_cubes;
use crate::util::matrix::WordMatrix;
use crate::util::pairs::{load_pair, store_pair};
use crate::util::reduce::cube_sum;
use cubecl::prelude::*;
use cubecl::server::Handle;

/// Units per cube of the sorting kernels (assignments per chunk).
pub const ROUTE_UNITS: usize = 256;
/// Units per cube of the row kernels (one cube per row, units over column pairs).
pub const ROW_UNITS: usize = 128;
/// The most experts the scan kernel's shared memory holds.
pub const MAX_EXPERTS: usize = 1024;

/// `index [tokens, k]`: the k largest of each row of `scores [tokens, experts]`, largest first.
#[cube(launch_unchecked)]
pub fn top_k_kernel(
    scores: &Array<f32>,
    index: &mut Array<i32>,
    tokens: usize,
    experts: usize,
    k: usize,
) {
    let t = ABSOLUTE_POS;
    if t < tokens {
        let base = t * experts;
        for j in 0..k {
            let mut best = 0usize;
            let mut best_value = 0.0f32;
            let mut found = false;
            for e in 0..experts {
                let mut taken = false;
                for i in 0..j {
                    if usize::cast_from(index[t * k + i]) == e {
                        taken = true;
                    }
                }
                let v = scores[base + e];
                if !taken && (!found || v > best_value) {
                    best = e;
                    best_value = v;
                    found = true;
                }
            }
            index[t * k + j] = i32::cast_from(best);
        }
    }
}

/// Whether `e` is a valid expert.
#[cube]
fn valid_expert(e: i32, experts: usize) -> bool {
    e >= 0i32 && usize::cast_from(e) < experts
}

/// Cube c: `rank[a]` for its chunk's assignments, `counts[c·experts + e]` for every expert.
#[cube(launch_unchecked)]
pub fn chunk_rank_kernel(
    expert: &Array<i32>,
    rank: &mut Array<u32>,
    counts: &mut Array<u32>,
    n: usize,
    experts: usize,
    chunks: usize,
) {
    let mut chunk_experts = SharedMemory::<i32>::new(ROUTE_UNITS);
    let chunk = CUBE_POS as usize;
    let unit = UNIT_POS as usize;
    let a = chunk * ROUTE_UNITS + unit;
    // Units past the last assignment hold an expert no assignment has.
    let mut e = i32::cast_from(experts);
    if a < n {
        e = expert[a];
    }
    chunk_experts[unit] = e;
    sync_cube();
    if a < n {
        let mut before = 0u32;
        for i in 0..unit {
            if chunk_experts[i] == e {
                before += 1u32;
            }
        }
        rank[a] = before;
    }
    // Each unit counts whole experts (no two units write one count).
    if chunk < chunks {
        for x in range_stepped(unit, experts, ROUTE_UNITS) {
            let mut count = 0u32;
            for i in 0..ROUTE_UNITS {
                if chunk_experts[i] == i32::cast_from(x) {
                    count += 1u32;
                }
            }
            counts[chunk * experts + x] = count;
        }
    }
}

/// One cube: `counts` become the counts of the chunks before (per expert), `m_splits[e]` the
/// totals, `start[e]` the total of the experts before e.
#[cube(launch_unchecked)]
pub fn chunk_scan_kernel(
    counts: &mut Array<u32>,
    m_splits: &mut Array<i32>,
    start: &mut Array<u32>,
    chunks: usize,
    experts: usize,
) {
    let mut totals = SharedMemory::<u32>::new(MAX_EXPERTS);
    let unit = UNIT_POS as usize;
    for e in range_stepped(unit, experts, ROUTE_UNITS) {
        let mut sum = 0u32;
        for c in 0..chunks {
            let v = counts[c * experts + e];
            counts[c * experts + e] = sum;
            sum += v;
        }
        m_splits[e] = i32::cast_from(sum);
        totals[e] = sum;
    }
    sync_cube();
    for e in range_stepped(unit, experts, ROUTE_UNITS) {
        let mut before = 0u32;
        for x in 0..e {
            before += totals[x];
        }
        start[e] = before;
    }
}

/// `position[a]`: the assignment's place in the packed batch (`n` for an invalid expert).
#[cube(launch_unchecked)]
pub fn expert_position_kernel(
    expert: &Array<i32>,
    rank: &Array<u32>,
    before: &Array<u32>,
    start: &Array<u32>,
    position: &mut Array<i32>,
    n: usize,
    experts: usize,
) {
    let a = ABSOLUTE_POS;
    if a < n {
        let e = expert[a];
        let mut p = n;
        if valid_expert(e, experts) {
            let x = usize::cast_from(e);
            let chunk = a / ROUTE_UNITS;
            p = usize::cast_from(start[x] + before[chunk * experts + x] + rank[a]);
        }
        position[a] = i32::cast_from(p);
    }
}

/// Units over `max(n, rows)`: the assignments' aligned rows and the rows' assignments.
#[cube(launch_unchecked)]
pub fn route_rows_kernel(
    position: &Array<i32>,
    packed_to_aligned: &Array<i32>,
    aligned_to_packed: &Array<i32>,
    assignment_row: &mut Array<i32>,
    row_assignment: &mut Array<i32>,
    row_token: &mut Array<i32>,
    n: usize,
    k: usize,
    rows: usize,
) {
    let i = ABSOLUTE_POS;
    if i < n {
        let p = usize::cast_from(position[i]);
        let mut row = rows;
        if p < n {
            row = usize::cast_from(packed_to_aligned[p]);
        }
        assignment_row[i] = i32::cast_from(row);
        if row < rows {
            row_assignment[row] = i32::cast_from(i);
            row_token[row] = i32::cast_from(i / k);
        }
    }
    // Rows that hold no assignment (padding, tail): their packed index is `n`. Disjoint from
    // the rows written above.
    if i < rows && usize::cast_from(aligned_to_packed[i]) >= n {
        row_assignment[i] = i32::cast_from(n);
        row_token[i] = i32::cast_from(n / k);
    }
}

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

fn too_large(what: String, rule: &str) -> KernelError {
    KernelError {
        value: what,
        rule: rule.to_string(),
    }
}

/// `[tokens, k]` i32 expert indices: the top k of each row of f32 `scores [tokens, experts]`.
pub fn top_k<R: Runtime>(
    client: &ComputeClient<R>,
    scores: &Handle,
    tokens: usize,
    experts: usize,
    k: usize,
) -> Result<Handle, KernelError> {
    if k == 0 || k > experts || tokens * experts >= u32::MAX as usize {
        return Err(too_large(
            format!("top {k} of scores [{tokens}, {experts}]"),
            "k must be between 1 and the number of experts, scores fewer than 2^32",
        ));
    }
    let out = client.empty((tokens * k).max(1) * 4);
    if tokens > 0 {
        unsafe {
            top_k_kernel::launch_unchecked::<R>(
                client,
                linear_cubes(client, tokens.div_ceil(ROUTE_UNITS)),
                CubeDim::new_1d(ROUTE_UNITS as u32),
                arg(scores, tokens * experts),
                arg(&out, tokens * k),
                tokens,
                experts,
                k,
            )
        };
    }
    Ok(out)
}

/// The stable counting sort of `n` assignments' experts (i32 `expert [n]`): i32 `m_splits
/// [experts]` and i32 `position [n]`.
pub fn expert_positions<R: Runtime>(
    client: &ComputeClient<R>,
    expert: &Handle,
    n: usize,
    experts: usize,
) -> Result<(Handle, Handle), KernelError> {
    if experts == 0 || experts > MAX_EXPERTS || n >= i32::MAX as usize {
        return Err(too_large(
            format!("{n} assignments to {experts} experts"),
            "between 1 and 1024 experts, fewer than 2^31 assignments",
        ));
    }
    let chunks = n.div_ceil(ROUTE_UNITS).max(1);
    let rank = client.empty(n.max(1) * 4);
    let counts = client.empty(chunks * experts * 4);
    let m_splits = client.empty(experts * 4);
    let start = client.empty(experts * 4);
    let position = client.empty(n.max(1) * 4);
    let dim = CubeDim::new_1d(ROUTE_UNITS as u32);
    unsafe {
        chunk_rank_kernel::launch_unchecked::<R>(
            client,
            linear_cubes(client, chunks),
            dim,
            arg(expert, n),
            arg(&rank, n),
            arg(&counts, chunks * experts),
            n,
            experts,
            chunks,
        );
        chunk_scan_kernel::launch_unchecked::<R>(
            client,
            CubeCount::Static(1, 1, 1),
            dim,
            arg(&counts, chunks * experts),
            arg(&m_splits, experts),
            arg(&start, experts),
            chunks,
            experts,
        );
        if n > 0 {
            expert_position_kernel::launch_unchecked::<R>(
                client,
                linear_cubes(client, chunks),
                dim,
                arg(expert, n),
                arg(&rank, n),
                arg(&counts, chunks * experts),
                arg(&start, experts),
                arg(&position, n),
                n,
                experts,
            );
        }
    }
    Ok((m_splits, position))
}

/// The row maps of `n = tokens·k` assignments in an aligned layout of `rows` rows (its i32
/// `packed_to_aligned [n]` and `aligned_to_packed [rows]`): i32 `assignment_row [n]`,
/// `row_assignment [rows]` and `row_token [rows]`.
pub fn route_rows<R: Runtime>(
    client: &ComputeClient<R>,
    position: &Handle,
    packed_to_aligned: &Handle,
    aligned_to_packed: &Handle,
    n: usize,
    k: usize,
    rows: usize,
) -> Result<(Handle, Handle, Handle), KernelError> {
    if k == 0 || n % k != 0 || n.max(rows) >= i32::MAX as usize {
        return Err(too_large(
            format!("{n} assignments of {k} per token, {rows} aligned rows"),
            "whole tokens (k > 0 choices each), fewer than 2^31 rows",
        ));
    }
    let assignment_row = client.empty(n.max(1) * 4);
    let row_assignment = client.empty(rows.max(1) * 4);
    let row_token = client.empty(rows.max(1) * 4);
    let units = n.max(rows);
    if units > 0 {
        unsafe {
            route_rows_kernel::launch_unchecked::<R>(
                client,
                linear_cubes(client, units.div_ceil(ROUTE_UNITS)),
                CubeDim::new_1d(ROUTE_UNITS as u32),
                arg(position, n),
                arg(packed_to_aligned, n),
                arg(aligned_to_packed, rows),
                arg(&assignment_row, n),
                arg(&row_assignment, rows),
                arg(&row_token, rows),
                n,
                k,
                rows,
            )
        };
    }
    Ok((assignment_row, row_assignment, row_token))
}

fn require_pairs(what: &str, rows: usize, cols: usize) -> Result<(), KernelError> {
    if cols % 2 != 0 || rows * cols >= u32::MAX as usize {
        return Err(too_large(
            format!("{what} [{rows}, {cols}]"),
            "the routing kernels take an even number of columns and fewer than 2^32 elements",
        ));
    }
    Ok(())
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
