//! Tensor amax (`max |x|`, NaN skipped): the first pass of FP8 current scaling and of NVFP4.
//! The NVFP4 variant also takes the amax of the RHT-transformed transpose in the same read, and
//! the grouped variant takes one amax per group of rows (MoE experts).
//! Results are f32 bit patterns, reduced with an atomic u32 max (non-negative floats order like
//! their bits), into buffers the caller zeroes first.
//!
//! The two whole-tensor passes go through the input from its end to its front: the cast that
//! follows starts at the front, and what the pass read last is what is still in L2 (50 MB on an
//! H100). Measured on an H100 with the cast kernels reversed instead (the same pairing), against
//! both front to back: FP8 current scaling rowwise 229.1 -> 220.1 µs at 16384x8192 bf16 and
//! 33.2 -> 26.8 µs at 4096x4096, NVFP4 rowwise 229.2 -> 223.5 / 35.2 -> 33.0 µs; casts writing
//! both directions gained 0-1 % at the large size (`benches/results/trace-h100/call2`).

use crate::cast::hadamard::rht16;
use crate::grouped::group_layout::{find_group, RowGroups};
use crate::grouped::row_gather::{gather_args, RowGather};
use crate::util::buffers::{arg, dummy, filled};
use crate::util::elements::{abs_bits_for_amax, load_chunk, ElemKind};
use crate::util::error::KernelError;
use crate::util::grid::{ceil_div, stride_cubes};
use crate::util::matrix::{INPUT_VECTOR, InputMatrix};
use crate::util::pairs::load_pair;
use crate::util::reduce::cube_max_into;

use cubecl::prelude::*;
use cubecl::server::Handle;

/// Units per cube of the amax kernels.
pub const AMAX_UNITS: usize = 256;

/// Each unit folds 8-element chunks `ABSOLUTE_POS, + stride, ...` of the flat input.
#[cube(launch_unchecked)]
pub fn amax_kernel<N: Size>(
    input: &Array<Vector<u32, N>>,
    out: &mut Array<Atomic<u32>>,
    num_chunks: usize,
    #[comptime] kind: ElemKind,
) {
    let mut values = Array::<f32>::new(8usize);
    let mut local = 0u32;
    let stride = CUBE_COUNT * comptime![AMAX_UNITS];
    for step in range_stepped(ABSOLUTE_POS, num_chunks, stride) {
        // End to front (see the module docs); a warp still reads contiguous bytes.
        let chunk = num_chunks - 1 - step;
        load_chunk::<N>(input, chunk * 8, &mut values, 0usize, kind);
        #[unroll]
        for i in 0..8usize {
            let a = abs_bits_for_amax(values[i]);
            if a > local {
                local = a;
            }
        }
    }
    let mut scratch = SharedMemory::<u32>::new(AMAX_UNITS);
    cube_max_into(local, &mut scratch, out, 0usize, AMAX_UNITS);
}

/// `max |x|` (NaN skipped) as f32 bits in a one-word buffer.
pub fn amax<R: Runtime>(client: &ComputeClient<R>, x: InputMatrix) -> Result<Handle, KernelError> {
    x.require_blocks(1, 8, "amax")?;
    let out = filled(client, 1, 0);
    let chunks = x.rows * x.cols / 8;
    unsafe {
        amax_kernel::launch_unchecked::<R>(
            client,
            CubeCount::new_1d(stride_cubes(client, chunks, AMAX_UNITS)),
            CubeDim::new_1d(AMAX_UNITS as u32),
            INPUT_VECTOR,
            x.arg(),
            arg(&out, 1),
            chunks,
            x.kind,
        )
    };
    Ok(out)
}

/// Rowwise amax of `x [rows, cols]` and amax of `RHT(xᵀ)` (16-element chunks along M), in one
/// read. Each unit folds (16 rows x 2 columns) pieces, consecutive units taking consecutive
/// column pairs so that each row read is coalesced. `rows % 16 == 0`, `cols % 2 == 0`.
#[cube(launch_unchecked)]
pub fn amax_rht_kernel(
    input: &Array<u32>,
    out_rowwise: &mut Array<Atomic<u32>>,
    out_rht: &mut Array<Atomic<u32>>,
    rows: usize,
    cols: usize,
    #[comptime] kind: ElemKind,
) {
    let pairs = cols / 2;
    let pieces = (rows / 16) * pairs;
    let mut a = Array::<f32>::new(16usize);
    let mut b = Array::<f32>::new(16usize);
    let mut local = 0u32;
    let mut local_rht = 0u32;
    let stride = CUBE_COUNT * comptime![AMAX_UNITS];
    for step in range_stepped(ABSOLUTE_POS, pieces, stride) {
        // End to front, as `amax_kernel`.
        let piece = pieces - 1 - step;
        let row0 = (piece / pairs) * 16;
        let col0 = (piece % pairs) * 2;
        #[unroll]
        for i in 0..16usize {
            let (x, y) = load_pair(input, (row0 + i) * cols + col0, kind);
            a[i] = x;
            b[i] = y;
            let m = max(abs_bits_for_amax(x), abs_bits_for_amax(y));
            local = select(m > local, m, local);
        }
        rht16(&mut a, 0usize, 1usize, kind);
        rht16(&mut b, 0usize, 1usize, kind);
        #[unroll]
        for i in 0..16usize {
            let m = max(abs_bits_for_amax(a[i]), abs_bits_for_amax(b[i]));
            local_rht = select(m > local_rht, m, local_rht);
        }
    }
    let mut scratch = SharedMemory::<u32>::new(AMAX_UNITS);
    cube_max_into(local, &mut scratch, out_rowwise, 0usize, AMAX_UNITS);
    sync_cube();
    cube_max_into(local_rht, &mut scratch, out_rht, 0usize, AMAX_UNITS);
}

/// Rowwise amax and the amax of `RHT(xᵀ)`, in one read.
pub fn amax_with_rht<R: Runtime>(
    client: &ComputeClient<R>,
    x: InputMatrix,
) -> Result<(Handle, Handle), KernelError> {
    x.require_blocks(16, 8, "amax with RHT")?;
    let rowwise = filled(client, 1, 0);
    let rht = filled(client, 1, 0);
    let pieces = (x.rows / 16) * (x.cols / 2);
    unsafe {
        amax_rht_kernel::launch_unchecked::<R>(
            client,
            CubeCount::new_1d(stride_cubes(client, pieces, AMAX_UNITS)),
            CubeDim::new_1d(AMAX_UNITS as u32),
            arg(x.handle, x.words()),
            arg(&rowwise, 1),
            arg(&rht, 1),
            x.rows,
            x.cols,
            x.kind,
        )
    };
    Ok((rowwise, rht))
}

/// Rows of one band of the grouped amax kernel (a multiple of the RHT's 16, a divisor of a group's
/// 128-row alignment, so a band never straddles two groups).
pub const GROUP_AMAX_ROWS: usize = 16;
/// Columns of one band: two per unit.
pub const GROUP_AMAX_COLS: usize = 2 * AMAX_UNITS;

/// One amax per group of rows (group g: rows `[group_start[g], group_start[g] + group_rows[g])`),
/// and with `rht` one amax of `RHT(xᵀ)` per group too. A cube covers a band of 16 rows x 512
/// columns, all in one group; bands past the last group (the zero tail) are skipped. Each unit
/// folds a 16 x 2 piece, consecutive units taking consecutive column pairs (coalesced reads).
#[cube(launch_unchecked)]
pub fn group_amax_kernel(
    input: &Array<u32>,
    group_start: &Array<u32>,
    group_rows: &Array<u32>,
    row_index: &Array<u32>,
    out_rowwise: &mut Array<Atomic<u32>>,
    out_rht: &mut Array<Atomic<u32>>,
    cols: usize,
    groups: usize,
    src_rows: usize,
    #[comptime] kind: ElemKind,
    #[comptime] rht: bool,
    #[comptime] gathered: bool,
) {
    let row0 = CUBE_POS_Y as usize * GROUP_AMAX_ROWS;
    let g = find_group(group_start, groups, row0);
    let in_group = row0 - usize::cast_from(group_start[g]) < usize::cast_from(group_rows[g]);
    // Uniform per cube: a tail band leaves before any synchronization.
    if in_group {
        let col0 = CUBE_POS_X as usize * GROUP_AMAX_COLS + UNIT_POS as usize * 2;
        let mut a = Array::<f32>::new(16usize);
        let mut b = Array::<f32>::new(16usize);
        let mut local = 0u32;
        let mut local_rht = 0u32;
        if col0 < cols {
            #[unroll]
            for i in 0..16usize {
                // Gathered: row `row_index[r]` of the packed input, zeros past its last row.
                let mut x = 0.0f32;
                let mut y = 0.0f32;
                if comptime![gathered] {
                    let src = usize::cast_from(row_index[row0 + i]);
                    if src < src_rows {
                        let (p, q) = load_pair(input, src * cols + col0, kind);
                        x = p;
                        y = q;
                    }
                } else {
                    let (p, q) = load_pair(input, (row0 + i) * cols + col0, kind);
                    x = p;
                    y = q;
                }
                a[i] = x;
                b[i] = y;
                let m = max(abs_bits_for_amax(x), abs_bits_for_amax(y));
                local = select(m > local, m, local);
            }
            if comptime![rht] {
                rht16(&mut a, 0usize, 1usize, kind);
                rht16(&mut b, 0usize, 1usize, kind);
                #[unroll]
                for i in 0..16usize {
                    let m = max(abs_bits_for_amax(a[i]), abs_bits_for_amax(b[i]));
                    local_rht = select(m > local_rht, m, local_rht);
                }
            }
        }
        let mut scratch = SharedMemory::<u32>::new(AMAX_UNITS);
        cube_max_into(local, &mut scratch, out_rowwise, g, AMAX_UNITS);
        if comptime![rht] {
            sync_cube();
            cube_max_into(local_rht, &mut scratch, out_rht, g, AMAX_UNITS);
        }
    }
}

/// One amax per row group (f32 bits, `[groups.count]`), and with `rht` one amax of `RHT(xᵀ)` per
/// group. Needs `cols % 2 == 0`; every group's rows are a multiple of 16.
pub fn group_amax<R: Runtime>(
    client: &ComputeClient<R>,
    x: InputMatrix,
    groups: RowGroups,
    rht: bool,
) -> Result<(Handle, Handle), KernelError> {
    group_amax_gathered(client, x, groups, rht, None)
}

/// `group_amax` of the matrix `x` read through `gather` (`RowGather`).
pub fn group_amax_gathered<R: Runtime>(
    client: &ComputeClient<R>,
    x: InputMatrix,
    groups: RowGroups,
    rht: bool,
    gather: Option<RowGather>,
) -> Result<(Handle, Handle), KernelError> {
    let (rows, row_index, src_rows) = gather_args(client, x, gather);
    InputMatrix { rows, ..x }.require_blocks(GROUP_AMAX_ROWS, 8, "grouped amax")?;
    let rowwise = filled(client, groups.count, 0);
    let post_rht = if rht {
        filled(client, groups.count, 0)
    } else {
        dummy(client)
    };
    let (start, group_rows) = groups.args();
    unsafe {
        group_amax_kernel::launch_unchecked::<R>(
            client,
            CubeCount::Static(
                ceil_div(x.cols, GROUP_AMAX_COLS) as u32,
                (rows / GROUP_AMAX_ROWS) as u32,
                1,
            ),
            CubeDim::new_1d(AMAX_UNITS as u32),
            arg(x.handle, x.words()),
            start,
            group_rows,
            row_index,
            arg(&rowwise, groups.count),
            arg(&post_rht, groups.count),
            x.cols,
            groups.count,
            src_rows,
            x.kind,
            rht,
            gather.is_some(),
        )
    };
    Ok((rowwise, post_rht))
}
