//! The last step of a blocked column sum: `out[c] = Σ_b partials[b, c]` over f32 `[blocks, cols]`
//! partial sums, blocks in order (so the result does not depend on scheduling). The norm and
//! activation backward kernels write the partials (dγ, dβ, dbias), and `sum_squares` its per-cube
//! sums.

use cubecl::prelude::*;
use cubecl::server::Handle;

const UNITS: usize = 256;

#[cube(launch_unchecked)]
pub fn column_partials_sum_kernel(
    partials: &Array<f32>,
    out: &mut Array<f32>,
    blocks: usize,
    cols: usize,
) {
    let col = ABSOLUTE_POS;
    if col < cols {
        let mut s = 0.0f32;
        for b in 0..blocks {
            s += partials[b * cols + col];
        }
        out[col] = s;
    }
}

/// f32 `[cols]` column sums of the f32 `[blocks, cols]` partials.
pub fn column_partials_sum<R: Runtime>(
    client: &ComputeClient<R>,
    partials: &Handle,
    blocks: usize,
    cols: usize,
) -> Handle {
    let out = client.empty(4 * cols.max(1));
    unsafe {
        column_partials_sum_kernel::launch_unchecked::<R>(
            client,
            cubecl::server::CubeCountSelection::new(client, cols.div_ceil(UNITS).max(1) as u32)
                .cube_count(),
            CubeDim::new_1d(UNITS as u32),
            ArrayArg::from_raw_parts(partials.clone(), (blocks * cols).max(1)),
            ArrayArg::from_raw_parts(out.clone(), cols.max(1)),
            blocks,
            cols,
        )
    };
    out
}
