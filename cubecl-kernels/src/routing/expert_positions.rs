//! A stable counting sort of the `T·k` assignments by expert: each assignment's position in
//! the packed batch, and the experts' token counts (the grouped GEMMs' `m_splits`).
//!
//! * `chunk_rank_kernel`: cube c takes assignments `c·256 ..`: each one's rank among the chunk's
//!   earlier assignments of its expert, and the chunk's count per expert.
//! * `chunk_scan_kernel` (one cube): per expert, the counts of the chunks before each chunk
//!   (in place), the expert's total (`m_splits`) and its first packed position.
//! * `expert_position_kernel`: `position[a] = start[e] + before[chunk][e] + rank[a]`.

use cubecl::prelude::*;
use cubecl::server::Handle;

use crate::routing::{too_large, MAX_EXPERTS, ROUTE_UNITS};
use crate::util::buffers::arg;
use crate::util::error::KernelError;
use crate::util::grid::linear_cubes;

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
