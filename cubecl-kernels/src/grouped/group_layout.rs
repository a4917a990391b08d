//! The layout of a grouped (MoE) tensor, computed on the device from the split sizes, so that no
//! host ever has to read them. Host reference: `burn_lowp::format::grouped::GroupLayoutHost`.
//!
//! Tokens arrive *packed*: group g's `m[g]` rows follow group g-1's. The GEMMs want them *aligned*:
//! group g starts at a multiple of `align` (128) rows, its rows padded with zero rows up to the next
//! multiple, so that every 128-row chunk of the aligned matrix belongs to one group. The aligned
//! matrix has `rows = roundup(tokens + (align - 1) * groups, align)` rows, a bound the host knows
//! without the splits; rows after the last group are a zero tail.
//!
//! * `group_scan_kernel` (one unit) scans the splits into per-group starts and sizes, and checks
//!   them: a negative split counts as 0, and splits whose running sum passes `tokens` are cut
//!   there, so that a bad split can never send a later kernel out of bounds. What it found is
//!   written to `status` (`[code, value, index]`, code 0 = valid), which the host reads later,
//!   where it reads the splits anyway.
//! * `group_rows_kernel` writes the row maps: the group of every aligned row (`groups` for padding
//!   and tail rows), the packed token of every aligned row (`tokens`, one past the last token, for
//!   padding), and the aligned row of every packed token.
//!
//! `RowGroups` is a layout's groups as the grouped kernels take them (starts and sizes on the
//! device).

use cubecl::prelude::*;
use cubecl::server::Handle;

use crate::util::buffers::{arg, dummy};
use crate::util::error::{require, KernelError};
use crate::util::matrix::InputMatrix;

/// The row group that holds `row` of a grouped matrix, as `(index, first row, rows)`; for a
/// matrix that is not grouped, `(0, 0, rows)`: all rows are one group. The quantize kernels ask
/// with the first row of a tile, which lies in one group (groups are multiples of 128 rows).
#[cube]
pub fn group_of_row(
    group_start: &Array<u32>,
    group_rows: &Array<u32>,
    groups: usize,
    rows: usize,
    row: usize,
    #[comptime] grouped: bool,
) -> (usize, usize, usize) {
    let mut g = 0usize;
    let mut g_start = 0usize;
    let mut g_rows = rows;
    if comptime![grouped] {
        g = find_group(group_start, groups, row);
        g_start = usize::cast_from(group_start[g]);
        g_rows = usize::cast_from(group_rows[g]);
    }
    (g, g_start, g_rows)
}

/// Status codes of `group_scan_kernel`.
pub const STATUS_OK: u32 = 0;
/// A split is negative: `value` holds its bits (i32), `index` the group.
pub const STATUS_NEGATIVE: u32 = 1;
/// The splits do not sum to `tokens`: `value` holds their sum (saturated at u32::MAX).
pub const STATUS_SUM: u32 = 2;
pub const STATUS_WORDS: usize = 3;

/// The largest `g < count` with `starts[g] <= value` (`starts` non-decreasing, `starts[0] == 0`).
/// Several groups may share a start (empty groups); the last of them is the one that holds rows.
#[cube]
pub fn find_group(starts: &Array<u32>, count: usize, value: usize) -> usize {
    let mut lo = 0usize;
    let mut hi = count;
    loop {
        if hi - lo <= 1 {
            break;
        }
        let mid = (lo + hi) / 2;
        if usize::cast_from(starts[mid]) <= value {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    lo
}

/// One unit scans `groups` splits. Outputs (u32 per group): aligned start and rows (a multiple
/// of `align`), packed start and tokens (the split, after the checks above).
#[cube(launch_unchecked)]
pub fn group_scan_kernel(
    m_splits: &Array<i32>,
    group_start: &mut Array<u32>,
    group_rows: &mut Array<u32>,
    packed_start: &mut Array<u32>,
    group_tokens: &mut Array<u32>,
    status: &mut Array<u32>,
    groups: usize,
    tokens: u32,
    align: u32,
) {
    if ABSOLUTE_POS == 0 {
        let mut packed = 0u32;
        let mut aligned = 0u32;
        let mut sum = 0u32;
        // A literal, not the const: CubeCL treats a variable initialized from a Rust const as a
        // compile-time value, and the assignments below would be lost.
        let mut code = 0u32;
        let mut value = 0u32;
        let mut index = 0u32;
        for g in 0..groups {
            let m = m_splits[g];
            let mut count = 0u32;
            if m < 0i32 {
                if code == 0u32 {
                    code = STATUS_NEGATIVE;
                    value = u32::reinterpret(m);
                    index = u32::cast_from(g);
                }
            } else {
                count = u32::cast_from(m);
                sum = sum.saturating_add(count);
            }
            let room = tokens - packed;
            if count > room {
                count = room;
            }
            packed_start[g] = packed;
            group_tokens[g] = count;
            group_start[g] = aligned;
            let padded = (count + align - 1u32) / align * align;
            group_rows[g] = padded;
            packed += count;
            aligned += padded;
        }
        if code == 0u32 && sum != tokens {
            code = STATUS_SUM;
            value = sum;
        }
        status[0] = code;
        status[1] = value;
        status[2] = index;
    }
}

/// One unit per aligned row (and per packed token): the row maps of the module docs.
#[cube(launch_unchecked)]
pub fn group_rows_kernel(
    group_start: &Array<u32>,
    packed_start: &Array<u32>,
    group_tokens: &Array<u32>,
    row_group: &mut Array<i32>,
    aligned_to_packed: &mut Array<i32>,
    packed_to_aligned: &mut Array<i32>,
    groups: usize,
    tokens: usize,
    rows: usize,
) {
    let i = ABSOLUTE_POS;
    if i < rows {
        let g = find_group(group_start, groups, i);
        let local = i - usize::cast_from(group_start[g]);
        if local < usize::cast_from(group_tokens[g]) {
            row_group[i] = i32::cast_from(g);
            aligned_to_packed[i] = i32::cast_from(usize::cast_from(packed_start[g]) + local);
        } else {
            row_group[i] = i32::cast_from(groups);
            aligned_to_packed[i] = i32::cast_from(tokens);
        }
    }
    if i < tokens {
        let g = find_group(packed_start, groups, i);
        let local = i - usize::cast_from(packed_start[g]);
        // A token past the (cut) splits only exists when the status reports an error; it reads
        // the last aligned row, which is then always tail.
        let target = select(
            local < usize::cast_from(group_tokens[g]),
            usize::cast_from(group_start[g]) + local,
            rows - 1,
        );
        packed_to_aligned[i] = i32::cast_from(target);
    }
}

/// The device buffers of a group layout (u32 per group unless noted).
#[derive(Debug, Clone)]
pub struct GroupLayoutBuffers {
    pub group_start: Handle,
    pub group_rows: Handle,
    pub packed_start: Handle,
    pub group_tokens: Handle,
    /// `[code, value, index]`.
    pub status: Handle,
    /// i32 `[rows]`.
    pub row_group: Handle,
    /// i32 `[rows]`.
    pub aligned_to_packed: Handle,
    /// i32 `[tokens]`.
    pub packed_to_aligned: Handle,
}

/// Rows of the aligned matrix of `tokens` tokens in `groups` groups.
pub fn aligned_rows(tokens: usize, groups: usize, align: usize) -> usize {
    (tokens + (align - 1) * groups).div_ceil(align) * align
}

/// Computes the layout of `groups` groups (i32 split sizes in `m_splits`) over `tokens` packed
/// tokens, aligned to `align` rows. Two launches, no host read.
pub fn group_layout<R: Runtime>(
    client: &ComputeClient<R>,
    m_splits: &Handle,
    groups: usize,
    tokens: usize,
    align: usize,
) -> GroupLayoutBuffers {
    assert!(groups > 0 && align > 0, "callers check the group count");
    let rows = aligned_rows(tokens, groups, align);
    let per_group = || client.empty(groups * 4);
    let (group_start, group_rows, packed_start, group_tokens) =
        (per_group(), per_group(), per_group(), per_group());
    let status = client.empty(STATUS_WORDS * 4);
    let arg = |h: &Handle, n: usize| unsafe { ArrayArg::from_raw_parts(h.clone(), n.max(1)) };
    unsafe {
        group_scan_kernel::launch_unchecked::<R>(
            client,
            CubeCount::Static(1, 1, 1),
            CubeDim::new_1d(1),
            arg(m_splits, groups),
            arg(&group_start, groups),
            arg(&group_rows, groups),
            arg(&packed_start, groups),
            arg(&group_tokens, groups),
            arg(&status, STATUS_WORDS),
            groups,
            tokens as u32,
            align as u32,
        )
    };
    let row_group = client.empty(rows.max(1) * 4);
    let aligned_to_packed = client.empty(rows.max(1) * 4);
    let packed_to_aligned = client.empty(tokens.max(1) * 4);
    let units = 256usize;
    let cubes = rows.max(tokens).div_ceil(units).max(1);
    unsafe {
        group_rows_kernel::launch_unchecked::<R>(
            client,
            cubecl::server::CubeCountSelection::new(client, cubes as u32).cube_count(),
            CubeDim::new_1d(units as u32),
            arg(&group_start, groups),
            arg(&packed_start, groups),
            arg(&group_tokens, groups),
            arg(&row_group, rows),
            arg(&aligned_to_packed, rows),
            arg(&packed_to_aligned, tokens),
            groups,
            tokens,
            rows,
        )
    };
    GroupLayoutBuffers {
        group_start,
        group_rows,
        packed_start,
        group_tokens,
        status,
        row_group,
        aligned_to_packed,
        packed_to_aligned,
    }
}

/// The row groups of a grouped (MoE) matrix: group g holds rows `[start[g], start[g] + rows[g])`
/// (u32 device arrays of `count` values). Groups follow each other from row 0, each a multiple of
/// 128 rows; rows after the last group form a tail that must hold zeros. Quantized grouped, every
/// group gets what quantizing its slice alone would give: its own per-tensor scale or global
/// amax, its own transposed columnwise block (`[cols, rows_g]` at `start_g * cols` elements).
#[derive(Clone, Copy)]
pub struct RowGroups<'a> {
    pub start: &'a Handle,
    pub rows: &'a Handle,
    pub count: usize,
}

impl RowGroups<'_> {
    pub(crate) fn args<R: Runtime>(&self) -> (ArrayArg<R>, ArrayArg<R>) {
        (arg(self.start, self.count), arg(self.rows, self.count))
    }
}

/// Group arrays and count of an optional grouping (dummies and 1 for an ungrouped matrix).
pub(crate) fn group_args<R: Runtime>(
    client: &ComputeClient<R>,
    groups: Option<RowGroups>,
) -> (ArrayArg<R>, ArrayArg<R>, usize) {
    match groups {
        Some(g) => {
            let (start, rows) = g.args();
            (start, rows, g.count)
        }
        None => {
            let dummy = dummy(client);
            (arg(&dummy, 1), arg(&dummy, 1), 1)
        }
    }
}

/// Grouped kernels need every group, hence the whole matrix, in whole 128-row chunks.
pub(crate) fn require_grouped_rows(x: &InputMatrix, groups: Option<RowGroups>) -> Result<(), KernelError> {
    match groups {
        Some(g) => require(
            x.rows % 128 == 0 && g.count > 0,
            format!("M = {} with {} groups", x.rows, g.count),
            "a grouped matrix has at least one group and M divisible by 128",
        ),
        None => Ok(()),
    }
}
