//! A Linear's bias gradient and its grad-output's amax in one read of `dy [rows, cols]`: the
//! column sums `Σ_rows dy` (dbias) and `max |dy|` (NaN skipped), the amax that FP8 current
//! scaling of dY would otherwise take in a pass of its own (TE fuses dbias into dY's cast for the
//! same reason). Without it a Linear's backward reads dY three times before its GEMMs: the bias's
//! column sums, the quantizer's amax and its cast.
//!
//! Each unit owns one column pair of a block of `DBIAS_BLOCK_ROWS` rows (as the activation
//! backward's bias partials); block sums are f32, formed in row order, and summed over blocks in
//! order afterwards (`partial_sums`), so the result does not depend on scheduling.

use cubecl::prelude::*;
use cubecl::server::Handle;

use crate::codec::abs_bits_for_amax;
use crate::launch::{filled, KernelError};
use crate::norm::{arg, require_pairs, WordMatrix};
use crate::pairs::load_pair;
use crate::partial_sums::column_partials_sum;
use crate::reduce::cube_max_into;

pub const DBIAS_UNITS: usize = 256;
/// Rows per unit and per block of partial sums.
pub const DBIAS_BLOCK_ROWS: usize = 64;

#[cube(launch_unchecked)]
pub fn dbias_amax_kernel(
    dy: &Array<u32>,
    amax_out: &mut Array<Atomic<u32>>,
    partials: &mut Array<f32>,
    rows: usize,
    cols: usize,
    #[comptime] kind: crate::codec::ElemKind,
) {
    let mut maxima = SharedMemory::<u32>::new(DBIAS_UNITS);
    let col = 2 * (CUBE_POS_X as usize * DBIAS_UNITS + UNIT_POS as usize);
    let block = CUBE_POS_Y as usize;
    let first = block * DBIAS_BLOCK_ROWS;
    let end = select(first + DBIAS_BLOCK_ROWS < rows, first + DBIAS_BLOCK_ROWS, rows);
    let mut local = 0u32;
    if col < cols {
        let mut sa = 0.0f32;
        let mut sb = 0.0f32;
        for row in first..end {
            let (a, b) = load_pair(dy, row * cols + col, kind);
            sa += a;
            sb += b;
            let m = max(abs_bits_for_amax(a), abs_bits_for_amax(b));
            local = select(m > local, m, local);
        }
        partials[block * cols + col] = sa;
        partials[block * cols + col + 1] = sb;
    }
    cube_max_into(local, &mut maxima, amax_out, 0usize, DBIAS_UNITS);
}

/// f32 `[cols]` column sums of `dy` and the f32 bits of `max |dy|` (a one-word buffer).
pub fn dbias_and_amax<R: Runtime>(
    client: &ComputeClient<R>,
    dy: WordMatrix,
) -> Result<(Handle, Handle), KernelError> {
    require_pairs(&dy, "dbias grad_output")?;
    let blocks = dy.rows.div_ceil(DBIAS_BLOCK_ROWS);
    let amax = filled(client, 1, 0);
    let partials = client.empty(4 * blocks * dy.cols);
    unsafe {
        dbias_amax_kernel::launch_unchecked::<R>(
            client,
            CubeCount::Static(
                (dy.cols / 2).div_ceil(DBIAS_UNITS) as u32,
                blocks as u32,
                1,
            ),
            CubeDim::new_1d(DBIAS_UNITS as u32),
            dy.arg(),
            arg(&amax, 1),
            arg(&partials, blocks * dy.cols),
            dy.rows,
            dy.cols,
            dy.kind,
        )
    };
    let dbias = column_partials_sum(client, &partials, blocks, dy.cols);
    Ok((dbias, amax))
}
