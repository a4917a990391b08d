//! GEMM-swizzled block-scale layout (128x4 tiles of 512 bytes, rows interleaved 32 x 4), the
//! in-kernel index used when quantize kernels write scales directly swizzled, and the standalone
//! swizzle / unswizzle kernels. Host reference: `burn_lowp::format::swizzle`.

use cubecl::prelude::*;

use crate::util::buffers::arg;
use crate::util::error::{require, KernelError};
use crate::util::grid::{ceil_div, linear_cubes};

use cubecl::server::Handle;

/// Byte offset of compact cell `(r, c)` in the swizzled buffer of a matrix with `cols` columns
/// (`cols` already padded to a multiple of 4).
#[cube]
pub fn swizzled_offset(r: usize, c: usize, cols: usize) -> usize {
    let col_tiles = cols / 4;
    ((r / 128) * col_tiles + c / 4) * 512 + (r % 32) * 16 + ((r % 128) / 32) * 4 + c % 4
}

/// Index of scale `(r, c)` of a `[rows, cols]` (padded) scale matrix, compact or swizzled.
#[cube]
pub fn scale_index(r: usize, c: usize, cols: usize, swizzled: bool) -> usize {
    select(swizzled, swizzled_offset(r, c, cols), r * cols + c)
}

/// One unit per compact cell of the padded `[rows, cols]` matrix. With `transpose`, the compact
/// input is `[cols, rows]` and its transpose is swizzled (MXFP8 columnwise scales).
#[cube(launch_unchecked)]
pub fn swizzle_kernel(
    compact: &Array<u8>,
    swizzled: &mut Array<u8>,
    rows: usize,
    cols: usize,
    #[comptime] transpose: bool,
) {
    let i = ABSOLUTE_POS;
    if i < rows * cols {
        let r = i / cols;
        let c = i % cols;
        let source = if transpose { c * rows + r } else { i };
        swizzled[swizzled_offset(r, c, cols)] = compact[source];
    }
}

/// Inverse of `swizzle_kernel`.
#[cube(launch_unchecked)]
pub fn unswizzle_kernel(
    swizzled: &Array<u8>,
    compact: &mut Array<u8>,
    rows: usize,
    cols: usize,
    #[comptime] transpose: bool,
) {
    let i = ABSOLUTE_POS;
    if i < rows * cols {
        let r = i / cols;
        let c = i % cols;
        let target = if transpose { c * rows + r } else { i };
        compact[target] = swizzled[swizzled_offset(r, c, cols)];
    }
}

/// Swizzles a padded compact `[rows, cols]` byte matrix (`rows % 128 == 0`, `cols % 4 == 0`).
/// With `transpose`, the compact input is `[cols, rows]` and its transpose is swizzled.
pub fn swizzle<R: Runtime>(
    client: &ComputeClient<R>,
    compact: &Handle,
    rows: usize,
    cols: usize,
    transpose: bool,
) -> Result<Handle, KernelError> {
    relayout(client, compact, rows, cols, transpose, true)
}

/// Inverse of [`swizzle`].
pub fn unswizzle<R: Runtime>(
    client: &ComputeClient<R>,
    swizzled: &Handle,
    rows: usize,
    cols: usize,
    transpose: bool,
) -> Result<Handle, KernelError> {
    relayout(client, swizzled, rows, cols, transpose, false)
}

fn relayout<R: Runtime>(
    client: &ComputeClient<R>,
    input: &Handle,
    rows: usize,
    cols: usize,
    transpose: bool,
    to_swizzled: bool,
) -> Result<Handle, KernelError> {
    require(
        rows % 128 == 0 && cols % 4 == 0 && rows > 0 && cols > 0,
        format!("scale shape [{rows}, {cols}]"),
        "swizzling needs scales padded to 128 x 4",
    )?;
    let n = rows * cols;
    let out = client.empty(n);
    let units = 256usize;
    let count = linear_cubes(client, ceil_div(n, units));
    let dim = CubeDim::new_1d(units as u32);
    unsafe {
        if to_swizzled {
            swizzle_kernel::launch_unchecked::<R>(
                client,
                count,
                dim,
                arg(input, n),
                arg(&out, n),
                rows,
                cols,
                transpose,
            )
        } else {
            unswizzle_kernel::launch_unchecked::<R>(
                client,
                count,
                dim,
                arg(input, n),
                arg(&out, n),
                rows,
                cols,
                transpose,
            )
        }
    };
    Ok(out)
}
