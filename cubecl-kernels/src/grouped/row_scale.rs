//! Per-group row scaling of a grouped GEMM's output, in place: the graph-safe grouped FP8 GEMM
//! (one cuBLASLt call for every group) can apply only one scale per operand, so it runs on unit
//! scales, and this pass multiplies the rows of group g by `scale_a[g] * scale_b[g]` (each
//! operand's `scale_inv` of that group). The product is the one cuBLASLt forms for a per-tensor
//! FP8 GEMM (`scale_a * scale_b * accumulator`, in f32), so a group's rows get what its own GEMM
//! would give up to the summation order, and, when the GEMM wrote BF16, one more rounding (the
//! unit-scale product is rounded to BF16 before the scaling rounds it again).
//!
//! Why in place and in the output's own precision: the pass is pure memory traffic beside the
//! GEMM (at N = 768 an f32 write, an f32 read and a BF16 write cost as much as the FP8 GEMM,
//! measured on an H100); a BF16 read and write is 2.5x less.

use cubecl::prelude::*;
use cubecl::server::Handle;

use crate::grouped::group_layout::{find_group, RowGroups};
use crate::util::elements::ElemKind;
use crate::util::pairs::{load_pair, store_pair};

/// Units per cube: one cube scales one row, its units striding over the row's element pairs (one
/// 32-bit word of bf16, two of f32), so that a warp's loads and stores are contiguous. A first
/// version gave each unit 8 neighbouring bf16 elements: its 2-byte accesses, 16 bytes apart
/// across the warp, wrote 7x the L2 sectors needed and ran at 32 % of DRAM peak (ncu, H100).
const UNITS: usize = 256;

#[cube(launch_unchecked)]
pub fn group_row_scale_kernel(
    data: &mut Array<u32>,
    group_start: &Array<u32>,
    group_rows: &Array<u32>,
    scale_a: &Array<u32>,
    scale_b: &Array<u32>,
    rows: usize,
    cols: usize,
    groups: usize,
    #[comptime] kind: ElemKind,
) {
    let row = CUBE_POS as usize;
    if row < rows {
        let g = find_group(group_start, groups, row);
        // Tail rows (after the last group) become zeros.
        let mut factor = 0.0f32;
        if row - usize::cast_from(group_start[g]) < usize::cast_from(group_rows[g]) {
            factor = f32::reinterpret(scale_a[g]) * f32::reinterpret(scale_b[g]);
        }
        let base = row * cols;
        for p in range_stepped(UNIT_POS as usize, cols / 2, UNITS) {
            let (a, b) = load_pair(data, base + 2 * p, kind);
            store_pair(data, base + 2 * p, a * factor, b * factor, kind);
        }
    }
}

/// Scales group g's rows of the `[rows, cols]` matrix `data` (`kind` elements, `cols` even) by
/// `scale_a[g] * scale_b[g]` (f32 bits, one per group) in place, rounding to `kind` (nearest
/// even); rows after the last group become 0.
#[allow(clippy::too_many_arguments)]
pub fn group_row_scale_in_place<R: Runtime>(
    client: &ComputeClient<R>,
    data: &Handle,
    groups: RowGroups,
    scale_a: &Handle,
    scale_b: &Handle,
    rows: usize,
    cols: usize,
    kind: ElemKind,
) {
    assert!(cols % 2 == 0, "callers pass GEMM outputs (cols % 16 == 0)");
    let n = rows * cols;
    if n == 0 {
        return;
    }
    let count = cubecl::server::CubeCountSelection::new(client, rows as u32).cube_count();
    let arg = |h: &Handle, len: usize| unsafe { ArrayArg::from_raw_parts(h.clone(), len.max(1)) };
    unsafe {
        group_row_scale_kernel::launch_unchecked::<R>(
            client,
            count,
            CubeDim::new_1d(UNITS as u32),
            arg(data, n * kind.bytes() / 4),
            arg(groups.start, groups.count),
            arg(groups.rows, groups.count),
            arg(scale_a, groups.count),
            arg(scale_b, groups.count),
            rows,
            cols,
            groups.count,
            kind,
        )
    }
}
