//! MXFP8: E8M0 scales per 1x32 (rowwise), 32x1 (columnwise) or 32x32 (2D) block, both directions
//! from one read. Host reference: `burn_lowp::format::mxfp8`.
//!
//! Three kernels, chosen by the launcher from the directions, block shape and input type:
//! - `mxfp8_kernel` (every case; the launcher takes it for f32 inputs): a cube of 128 units covers one 32-row
//!   block x 128 columns; each unit owns 4 rows x 8 columns. Block amaxes go through shared
//!   memory in two steps (per-unit partials, then one unit per block).
//! - `mxfp8_rowwise_kernel` (rowwise only, 1D): one unit per 1x32 block, no shared memory.
//! - `mxfp8_strip_kernel` (16-bit inputs: columnwise with or without rowwise, and 2D blocks in
//!   any direction): one unit per 32x4 column strip, column amaxes in registers.
//!
//! Codes are written as u32 words in the `[M, K]` layout for both directions; scales as bytes,
//! compact or GEMM-swizzled.
//!
//! This module holds what the kernels share and the launcher that picks one.

use cubecl::prelude::*;

use crate::cast::codec::{Fp8Encoder, Fp8Kind};
use crate::cast::flags::SWIZZLED;
use crate::cast::kernel_choice::{fp8_encoder, tile_kernels_forced, unroll};
use crate::cast::output::{scale_bytes, CastBuffers, Directions, QuantizeOutput};
use crate::util::elements::ElemKind;
use crate::util::error::KernelError;
use crate::util::grid::{ceil_div, linear_cubes, round_up};
use crate::util::matrix::{INPUT_VECTOR, InputMatrix};

pub mod rowwise;
pub mod strip;
pub mod tile;

use rowwise::{mxfp8_rowwise_kernel, MX_ROWWISE_UNITS};
use strip::{mxfp8_strip_kernel, MX_STRIP_TILE_COLS, MX_STRIP_UNITS, MX_STRIP_VECTOR};
use tile::{mxfp8_kernel, MX_TILE_COLS, MX_UNITS};

/// Rows of a block-row: the 32 rows one 32x1 or 32x32 block spans.
pub const MX_TILE_ROWS: usize = 32;

#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub struct Mxfp8Config {
    pub kind: ElemKind,
    pub fp8: Fp8Kind,
    pub block_2d: bool,
    /// f32 bits of `1 / fp8_max`.
    pub reciprocal_max_bits: u32,
    /// Fully unroll the per-row / per-column loops (fast code; slow to compile on lavapipe).
    pub unroll: bool,
    pub encoder: Fp8Encoder,
}

/// Columns of the rowwise scale matrix: one E8M0 byte per 32 columns, padded to a multiple of 4.
#[cube]
fn padded_row_scale_cols(cols: usize) -> usize {
    (cols / 32 + 3) / 4 * 4
}

#[cube]
fn pack4(codes: &Array<u32>, base: usize) -> u32 {
    codes[base]
        | (codes[base + 1] << 8u32)
        | (codes[base + 2] << 16u32)
        | (codes[base + 3] << 24u32)
}

/// Byte sizes of MXFP8 compact scales: rowwise `[roundup(M,128), roundup(K/32,4)]`, columnwise
/// `[roundup(M/32,4), roundup(K,128)]`.
pub fn mxfp8_scale_shapes(rows: usize, cols: usize) -> ([usize; 2], [usize; 2]) {
    (
        [round_up(rows, 128), round_up(cols / 32, 4)],
        [round_up(rows / 32, 4), round_up(cols, 128)],
    )
}

/// MXFP8, E4M3 or E5M2 elements. Needs `M % 32 == 0` and `K % 32 == 0`.
pub fn quantize_mxfp8<R: Runtime>(
    client: &ComputeClient<R>,
    x: InputMatrix,
    fp8: Fp8Kind,
    block_2d: bool,
    directions: Directions,
    swizzled: bool,
) -> Result<QuantizeOutput, KernelError> {
    x.require_blocks(32, 32, "MXFP8")?;
    let n = x.rows * x.cols;
    let (row_shape, col_shape) = mxfp8_scale_shapes(x.rows, x.cols);
    let buffers = CastBuffers::new(
        client,
        directions,
        n,
        (
            || scale_bytes(client, row_shape, Some([x.rows, x.cols / 32])),
            row_shape[0] * row_shape[1],
        ),
        (
            || scale_bytes(client, col_shape, Some([x.rows / 32, x.cols])),
            col_shape[0] * col_shape[1],
        ),
    );
    let max = match fp8 {
        Fp8Kind::E4M3 => 448.0f32,
        Fp8Kind::E5M2 => 57344.0f32,
    };
    let config = Mxfp8Config {
        kind: x.kind,
        fp8,
        block_2d,
        reciprocal_max_bits: (1.0f32 / max).to_bits(),
        unroll: unroll(client),
        encoder: fp8_encoder(client),
    };
    let flags = directions.flags() | if swizzled { SWIZZLED } else { 0 };
    // The tile and strip kernels take the same arguments, the strip kernel's directions last.
    macro_rules! launch_tiles {
        ($kernel:ident, $tile_cols:expr, $units:expr, $vector:expr $(, $directions:expr)*) => {
            unsafe {
                $kernel::launch_unchecked::<R>(
                    client,
                    CubeCount::Static(
                        ceil_div(x.cols, $tile_cols) as u32,
                        (x.rows / MX_TILE_ROWS) as u32,
                        1,
                    ),
                    CubeDim::new_1d($units as u32),
                    $vector,
                    x.arg(),
                    buffers.arg(),
                    x.rows,
                    x.cols,
                    flags,
                    config,
                    $($directions,)*
                )
            }
        };
    }
    if (directions.columnwise || block_2d) && x.kind != ElemKind::F32 && !tile_kernels_forced() {
        // 16-bit input, columnwise or 2D blocks: one unit per 32x4 strip.
        launch_tiles!(
            mxfp8_strip_kernel,
            MX_STRIP_TILE_COLS,
            MX_STRIP_UNITS,
            MX_STRIP_VECTOR,
            directions.rowwise,
            directions.columnwise
        );
    } else if directions.rowwise && !directions.columnwise && !block_2d {
        // Rowwise only with 1D blocks: one unit per block, no shared memory.
        let (codes, scales) = buffers.rowwise_args();
        unsafe {
            mxfp8_rowwise_kernel::launch_unchecked::<R>(
                client,
                linear_cubes(client, (n / 32).div_ceil(MX_ROWWISE_UNITS)),
                CubeDim::new_1d(MX_ROWWISE_UNITS as u32),
                INPUT_VECTOR,
                x.arg(),
                codes,
                scales,
                x.rows,
                x.cols,
                flags,
                config,
            )
        };
    } else {
        launch_tiles!(mxfp8_kernel, MX_TILE_COLS, MX_UNITS, INPUT_VECTOR);
    }
    Ok(buffers.into_output(directions, None))
}
