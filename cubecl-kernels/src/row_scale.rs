//! Per-group row scaling of a grouped GEMM's output: the graph-safe grouped FP8 GEMM (one cuBLASLt
//! call for every group) can apply only one scale per operand, so it runs on unit scales and
//! writes f32; this pass multiplies the rows of group g by `scale_a[g] * scale_b[g]` (each
//! operand's `scale_inv` of that group) and rounds once to the output dtype. The product is the
//! one cuBLASLt forms for a per-tensor FP8 GEMM (`scale_a * scale_b * accumulator`, in f32), so
//! a group's rows get what its own GEMM would give, up to the summation order.

use cubecl::prelude::*;
use cubecl::server::Handle;

use crate::group_layout::find_group;
use crate::launch::RowGroups;

/// Elements per unit (the GEMM's output columns are a multiple of 16).
const PER_UNIT: usize = 4;

#[cube(launch_unchecked)]
pub fn group_row_scale_kernel<F: Float>(
    input: &Array<f32>,
    group_start: &Array<u32>,
    group_rows: &Array<u32>,
    scale_a: &Array<u32>,
    scale_b: &Array<u32>,
    out: &mut Array<F>,
    rows: usize,
    cols: usize,
    groups: usize,
) {
    let first = ABSOLUTE_POS * PER_UNIT;
    if first < rows * cols {
        let row = first / cols;
        let g = find_group(group_start, groups, row);
        // Tail rows (after the last group) hold zeros.
        let mut factor = 0.0f32;
        if row - usize::cast_from(group_start[g]) < usize::cast_from(group_rows[g]) {
            factor = f32::reinterpret(scale_a[g]) * f32::reinterpret(scale_b[g]);
        }
        #[unroll]
        for i in 0..PER_UNIT {
            out[first + i] = F::cast_from(input[first + i] * factor);
        }
    }
}

/// Output element types of the row-scale pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RowScaleOutput {
    F32,
    F16,
    BF16,
}

impl RowScaleOutput {
    pub fn bytes(self) -> usize {
        match self {
            RowScaleOutput::F32 => 4,
            RowScaleOutput::F16 | RowScaleOutput::BF16 => 2,
        }
    }
}

/// `[rows, cols]` f32 `input` with group g's rows scaled by `scale_a[g] * scale_b[g]` (f32 bits,
/// one per group), in `output` precision; rows after the last group become 0. `cols % 4 == 0`.
#[allow(clippy::too_many_arguments)]
pub fn group_row_scale<R: Runtime>(
    client: &ComputeClient<R>,
    input: &Handle,
    groups: RowGroups,
    scale_a: &Handle,
    scale_b: &Handle,
    rows: usize,
    cols: usize,
    output: RowScaleOutput,
) -> Handle {
    assert!(cols % PER_UNIT == 0, "callers pass GEMM outputs (cols % 16 == 0)");
    let n = rows * cols;
    let out = client.empty(n.max(1) * output.bytes());
    let units = 256usize;
    let count = cubecl::server::CubeCountSelection::new(
        client,
        (n / PER_UNIT).div_ceil(units).max(1) as u32,
    )
    .cube_count();
    let arg = |h: &Handle, len: usize| unsafe { ArrayArg::from_raw_parts(h.clone(), len.max(1)) };
    let dim = CubeDim::new_1d(units as u32);
    macro_rules! launch {
        ($f:ty) => {
            unsafe {
                group_row_scale_kernel::launch_unchecked::<$f, R>(
                    client,
                    count,
                    dim,
                    arg(input, n),
                    arg(groups.start, groups.count),
                    arg(groups.rows, groups.count),
                    arg(scale_a, groups.count),
                    arg(scale_b, groups.count),
                    arg(&out, n),
                    rows,
                    cols,
                    groups.count,
                )
            }
        };
    }
    match output {
        RowScaleOutput::F32 => launch!(f32),
        RowScaleOutput::F16 => launch!(half::f16),
        RowScaleOutput::BF16 => launch!(half::bf16),
    }
    out
}
