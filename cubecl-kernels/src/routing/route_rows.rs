//! Every assignment's row in the experts' aligned batch (the layout `group_layout` makes from
//! the `m_splits`): `assignment_row[a] = packed_to_aligned[position[a]]`, and the inverse per
//! aligned row (`row_assignment`, `row_token`), `n` / `T` for rows that hold no token.

use cubecl::prelude::*;
use cubecl::server::Handle;

use crate::routing::{too_large, ROUTE_UNITS};
use crate::util::buffers::arg;
use crate::util::error::KernelError;
use crate::util::grid::linear_cubes;

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
