//! FP8 block scales in the layouts cuBLASLt reads on Hopper, from the compact layouts the quantize
//! kernels write, in one launch per operand:
//! - 1x128 blocks (`VEC128_32F`): `[outer, K/128]` -> `[K/128][outer]`, transposed;
//! - 128x128 tiles (`BLK128x128_32F`): `[outer/128, K/128]` -> `[outer/128][roundup(K/128, 4)]`,
//!   the padding cells 1.0 (cuBLASLt reads them; a finite value keeps them harmless).
//!
//! A GEMM used to do this with Burn ops (a transpose made contiguous; ones and a concatenation),
//! several launches through Burn's generic path that cost about 29 µs of host time per FP8 block
//! GEMM at 1024^3, more than the GEMM itself.

use cubecl::prelude::*;
use cubecl::server::Handle;

use crate::util::buffers::arg;
use crate::util::grid::linear_cubes;

const UNITS: usize = 256;

/// One unit per output word. `transpose`: output `[cols, rows]`; otherwise output
/// `[rows, padded_cols]` with 1.0 past `cols`.
#[cube(launch_unchecked)]
pub fn gemm_block_scales_kernel(
    input: &Array<u32>,
    output: &mut Array<u32>,
    rows: usize,
    cols: usize,
    padded_cols: usize,
    #[comptime] transpose: bool,
) {
    let i = ABSOLUTE_POS;
    if comptime![transpose] {
        if i < rows * cols {
            output[i] = input[(i % rows) * cols + i / rows];
        }
    } else if i < rows * padded_cols {
        let c = i % padded_cols;
        let mut word = 0x3F80_0000u32; // 1.0
        if c < cols {
            word = input[(i / padded_cols) * cols + c];
        }
        output[i] = word;
    }
}

/// The layout cuBLASLt reads, for compact f32 scales `[rows, cols]` in `scales`.
pub enum GemmBlockScales {
    /// 1x128: transposed, `[cols, rows]`.
    Transposed,
    /// 128x128: rows padded to a multiple of 4 columns, `[rows, roundup(cols, 4)]`.
    PaddedRows,
}

/// A new buffer holding `scales` (`[rows, cols]` f32, compact) in `layout`.
pub fn gemm_block_scales<R: Runtime>(
    client: &ComputeClient<R>,
    scales: &Handle,
    rows: usize,
    cols: usize,
    layout: GemmBlockScales,
) -> Handle {
    let transpose = matches!(layout, GemmBlockScales::Transposed);
    let padded_cols = if transpose { cols } else { cols.div_ceil(4) * 4 };
    let words = rows * padded_cols;
    let output = client.empty(words.max(1) * 4);
    unsafe {
        gemm_block_scales_kernel::launch_unchecked::<R>(
            client,
            linear_cubes(client, words.div_ceil(UNITS)),
            CubeDim::new_1d(UNITS as u32),
            arg(scales, rows * cols),
            arg(&output, words),
            rows,
            cols,
            padded_cols,
            transpose,
        )
    };
    output
}
