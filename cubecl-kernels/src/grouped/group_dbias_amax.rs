//! A grouped (MoE) layer's bias gradient and its grad-output's per-group amaxes in one read of
//! `dy`: per group g, the column sums of its rows (`[groups, cols]` f32, the experts' dbias) and
//! `max |dy|` over them (NaN skipped), the amax that FP8 current scaling of dY would otherwise
//! take in a pass of its own. `dy` is the aligned batch (each group a multiple of 128 rows,
//! padding rows zero) or, through a row map (`RowGather`), the packed token rows, so that the
//! padded copy of dY is never written.
//!
//! Each unit owns one column pair of a block of `GROUP_DBIAS_ROWS` aligned rows (a block lies in
//! one group: groups are multiples of 128 rows); block sums are f32 formed in row order, then
//! summed over the group's blocks in order (`group_partials_sum_kernel`), so the result does not
//! depend on scheduling.

use cubecl::prelude::*;
use cubecl::server::Handle;

use crate::grouped::group_layout::{find_group, RowGroups};
use crate::grouped::row_gather::{gather_args, RowGather};
use crate::norm_act::dbias_amax::fold_four_rows;
use crate::util::buffers::filled;
use crate::util::elements::ElemKind;
use crate::util::error::KernelError;
use crate::util::matrix::InputMatrix;
use crate::util::pairs::load_pair;
use crate::util::reduce::cube_max_into;

pub const GROUP_DBIAS_UNITS: usize = 256;
/// Aligned rows per block of partial sums (a divisor of the groups' 128-row alignment).
pub const GROUP_DBIAS_ROWS: usize = 64;

/// Row `row` of the matrix as a column pair: row `row_index[row]` of `dy` when gathered (zeros
/// past its `src_rows`), else row `row`.
#[cube]
fn pair_at(
    dy: &Array<u32>,
    row_index: &Array<u32>,
    row: usize,
    col: usize,
    cols: usize,
    src_rows: usize,
    #[comptime] kind: ElemKind,
    #[comptime] gathered: bool,
) -> (f32, f32) {
    let mut a = 0.0f32;
    let mut b = 0.0f32;
    if comptime![gathered] {
        let src = usize::cast_from(row_index[row]);
        if src < src_rows {
            let (p, q) = load_pair(dy, src * cols + col, kind);
            a = p;
            b = q;
        }
    } else {
        let (p, q) = load_pair(dy, row * cols + col, kind);
        a = p;
        b = q;
    }
    (a, b)
}

#[cube(launch_unchecked)]
pub fn group_dbias_amax_kernel(
    dy: &Array<u32>,
    row_index: &Array<u32>,
    group_start: &Array<u32>,
    group_rows: &Array<u32>,
    amax_out: &mut Array<Atomic<u32>>,
    partials: &mut Array<f32>,
    cols: usize,
    groups: usize,
    src_rows: usize,
    #[comptime] kind: ElemKind,
    #[comptime] gathered: bool,
    #[comptime] amax: bool,
) {
    let block = CUBE_POS_Y as usize;
    let first = block * GROUP_DBIAS_ROWS;
    let g = find_group(group_start, groups, first);
    // Uniform per cube: blocks past the last group (the zero tail) do nothing.
    if first - usize::cast_from(group_start[g]) < usize::cast_from(group_rows[g]) {
        let mut maxima = SharedMemory::<u32>::new(GROUP_DBIAS_UNITS);
        let col = 2 * (CUBE_POS_X as usize * GROUP_DBIAS_UNITS + UNIT_POS as usize);
        let mut local = 0u32;
        if col < cols {
            let mut sa = 0.0f32;
            let mut sb = 0.0f32;
            // Four rows' loads before their adds (`dbias_amax::fold_four_rows`), in row order.
            for q in 0..GROUP_DBIAS_ROWS / 4 {
                let row = first + 4 * q;
                let (a0, b0) = pair_at(dy, row_index, row, col, cols, src_rows, kind, gathered);
                let (a1, b1) = pair_at(dy, row_index, row + 1, col, cols, src_rows, kind, gathered);
                let (a2, b2) = pair_at(dy, row_index, row + 2, col, cols, src_rows, kind, gathered);
                let (a3, b3) = pair_at(dy, row_index, row + 3, col, cols, src_rows, kind, gathered);
                let (x, y, m) = fold_four_rows(sa, sb, local, a0, b0, a1, b1, a2, b2, a3, b3, amax);
                sa = x;
                sb = y;
                local = m;
            }
            partials[block * cols + col] = sa;
            partials[block * cols + col + 1] = sb;
        }
        if comptime![amax] {
            cube_max_into(local, &mut maxima, amax_out, g, GROUP_DBIAS_UNITS);
        }
    }
}

/// `out[g, c] = Σ partials[b, c]` over group g's blocks, in order (0 for an empty group).
#[cube(launch_unchecked)]
pub fn group_partials_sum_kernel(
    partials: &Array<f32>,
    group_start: &Array<u32>,
    group_rows: &Array<u32>,
    out: &mut Array<f32>,
    cols: usize,
) {
    let col = CUBE_POS_X as usize * GROUP_DBIAS_UNITS + UNIT_POS as usize;
    let g = CUBE_POS_Y as usize;
    if col < cols {
        let first = usize::cast_from(group_start[g]) / GROUP_DBIAS_ROWS;
        let blocks = usize::cast_from(group_rows[g]) / GROUP_DBIAS_ROWS;
        let mut s = 0.0f32;
        let quads = blocks / 4;
        for q in 0..quads {
            let b = first + 4 * q;
            let p0 = partials[b * cols + col];
            let p1 = partials[(b + 1) * cols + col];
            let p2 = partials[(b + 2) * cols + col];
            let p3 = partials[(b + 3) * cols + col];
            s += p0;
            s += p1;
            s += p2;
            s += p3;
        }
        for b in first + 4 * quads..first + blocks {
            s += partials[b * cols + col];
        }
        out[g * cols + col] = s;
    }
}

/// Per-group f32 column sums `[groups.count, cols]` of the grouped matrix `dy` (read through
/// `gather` where given) and, with `amax`, one f32 amax per group (bits, `[groups.count]`).
/// Needs an even `cols` and whole 128-row groups.
pub fn group_dbias_amax<R: Runtime>(
    client: &ComputeClient<R>,
    dy: InputMatrix,
    groups: RowGroups,
    gather: Option<RowGather>,
    amax: bool,
) -> Result<(Handle, Option<Handle>), KernelError> {
    let (rows, row_index, src_rows) = gather_args(client, dy, gather);
    let seen = InputMatrix { rows, ..dy };
    seen.require_blocks(128, 2, "grouped dbias")?;
    let blocks = rows / GROUP_DBIAS_ROWS;
    let amax_out = if amax {
        filled(client, groups.count, 0)
    } else {
        client.empty(16)
    };
    let partials = client.empty(4 * blocks * dy.cols);
    let out = client.empty(4 * groups.count * dy.cols);
    let arg = |h: &Handle, len: usize| unsafe { ArrayArg::from_raw_parts(h.clone(), len.max(1)) };
    let col_cubes = (dy.cols / 2).div_ceil(GROUP_DBIAS_UNITS) as u32;
    unsafe {
        group_dbias_amax_kernel::launch_unchecked::<R>(
            client,
            CubeCount::Static(col_cubes, blocks as u32, 1),
            CubeDim::new_1d(GROUP_DBIAS_UNITS as u32),
            arg(dy.handle, dy.rows * dy.cols * dy.kind.bytes() / 4),
            row_index,
            arg(groups.start, groups.count),
            arg(groups.rows, groups.count),
            arg(&amax_out, if amax { groups.count } else { 1 }),
            arg(&partials, blocks * dy.cols),
            dy.cols,
            groups.count,
            src_rows,
            dy.kind,
            gather.is_some(),
            amax,
        );
        group_partials_sum_kernel::launch_unchecked::<R>(
            client,
            CubeCount::Static(dy.cols.div_ceil(GROUP_DBIAS_UNITS) as u32, groups.count as u32, 1),
            CubeDim::new_1d(GROUP_DBIAS_UNITS as u32),
            arg(&partials, blocks * dy.cols),
            arg(groups.start, groups.count),
            arg(groups.rows, groups.count),
            arg(&out, groups.count * dy.cols),
            dy.cols,
        );
    }
    Ok((out, amax.then_some(amax_out)))
}
