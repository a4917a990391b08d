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

use crate::util::buffers::{arg, filled};
use crate::util::elements::{abs_bits_for_amax, ElemKind};
use crate::util::error::KernelError;
use crate::util::matrix::{require_pairs, WordMatrix};
use crate::util::pairs::load_pair;
use crate::util::partial_sums::column_partials_sum;
use crate::util::reduce::cube_max_into;

pub const DBIAS_UNITS: usize = 256;
/// Rows per unit and per block of partial sums.
pub const DBIAS_BLOCK_ROWS: usize = 64;

/// Four rows' column pairs `(a_i, b_i)` added to the running sums `(sa, sb)` in row order, and,
/// with `amax`, their `|x|` folded into the running amax bits `local`.
#[cube]
#[allow(clippy::too_many_arguments)]
pub fn fold_four_rows(
    sa: f32,
    sb: f32,
    local: u32,
    a0: f32,
    b0: f32,
    a1: f32,
    b1: f32,
    a2: f32,
    b2: f32,
    a3: f32,
    b3: f32,
    #[comptime] amax: bool,
) -> (f32, f32, u32) {
    let mut x = sa;
    let mut y = sb;
    x += a0;
    x += a1;
    x += a2;
    x += a3;
    y += b0;
    y += b1;
    y += b2;
    y += b3;
    let mut m = local;
    if comptime![amax] {
        let m01 = max(
            max(abs_bits_for_amax(a0), abs_bits_for_amax(b0)),
            max(abs_bits_for_amax(a1), abs_bits_for_amax(b1)),
        );
        let m23 = max(
            max(abs_bits_for_amax(a2), abs_bits_for_amax(b2)),
            max(abs_bits_for_amax(a3), abs_bits_for_amax(b3)),
        );
        let m4 = max(m01, m23);
        m = select(m4 > local, m4, local);
    }
    (x, y, m)
}

#[cube(launch_unchecked)]
pub fn dbias_amax_kernel(
    dy: &Array<u32>,
    amax_out: &mut Array<Atomic<u32>>,
    partials: &mut Array<f32>,
    rows: usize,
    cols: usize,
    #[comptime] kind: ElemKind,
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
        // Four rows' loads are issued before their adds (one 4-byte load in flight per thread
        // does not fill the memory pipeline); the adds stay in row order, so the sums do not
        // change.
        let quads = (end - first) / 4;
        for q in 0..quads {
            let row = first + 4 * q;
            let (a0, b0) = load_pair(dy, row * cols + col, kind);
            let (a1, b1) = load_pair(dy, (row + 1) * cols + col, kind);
            let (a2, b2) = load_pair(dy, (row + 2) * cols + col, kind);
            let (a3, b3) = load_pair(dy, (row + 3) * cols + col, kind);
            let (x, y, m) = fold_four_rows(sa, sb, local, a0, b0, a1, b1, a2, b2, a3, b3, true);
            sa = x;
            sb = y;
            local = m;
        }
        for row in first + 4 * quads..end {
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
