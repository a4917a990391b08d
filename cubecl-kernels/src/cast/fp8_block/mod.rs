//! FP8 block scaling: f32 scales per 1x128 block or 128x128 tile, rowwise `[M, K]` and transposed
//! columnwise `[K, M]` (blocks along M) codes from one read. Host reference:
//! `burn_lowp::format::fp8_block`.
//!
//! Two kernels, one cube per 128x128 tile, block maxima reduced through shared memory (partials,
//! then one unit per row/column):
//! - `fp8_block_kernel` (every case; the launcher takes it for the rowwise copy alone and for f32
//!   inputs): 512 units of 4 rows x 8 columns;
//! - `fp8_block_transposed_kernel` (16-bit inputs with the transposed copy, grouped rows too): 128
//!   units of 16 rows x 8 columns, shaped for 16-byte transposed stores.
//!
//! Scales are `scale_inv` f32 bits: rowwise `[M, K/128]` (1D) or `[M/128, K/128]` (2D), columnwise
//! `[K, M/128]` (1D) or `[K/128, M/128]` (2D).
//!
//! This module holds what the kernels share and the launcher that picks one.

use cubecl::prelude::*;

use crate::cast::codec::Fp8Encoder;
use crate::cast::kernel_choice::{fp8_encoder, tile_kernels_forced, unroll};
use crate::cast::output::{CastBuffers, Directions, QuantizeOutput};
use crate::cast::scale::ScaleRule;
use crate::grouped::group_layout::{group_args, group_of_row, require_grouped_rows, RowGroups};
use crate::util::elements::ElemKind;
use crate::util::error::KernelError;
use crate::util::matrix::{INPUT_VECTOR, InputMatrix};

pub mod tile;
pub mod transposed;

use tile::{fp8_block_kernel, BLOCK_UNITS};
use transposed::{fp8_block_transposed_kernel, TRANSPOSED_UNITS};

/// Rows and columns of a 128x128 tile, and elements of a 1x128 block.
pub const BLOCK_TILE: usize = 128;

#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub struct Fp8BlockKernelConfig {
    pub kind: ElemKind,
    pub rule: ScaleRule,
    pub block_2d: bool,
    /// Fully unroll the per-row / per-column loops (fast code; slow to compile on lavapipe).
    pub unroll: bool,
    /// Rows form groups (multiples of 128 rows) whose columnwise copies are transposed each on
    /// its own: codes `[cols, rows_g]` at `start_g * cols`, scales `[cols, rows_g / 128]` (1x128)
    /// or `[cols / 128, rows_g / 128]` (128x128) at `start_g / 128` scale rows. Rowwise data does
    /// not change: its blocks never cross rows.
    pub grouped: bool,
    pub encoder: Fp8Encoder,
}

/// The group of rows a 128-row tile lies in, as `(first row, rows)` (see
/// `Fp8BlockKernelConfig::grouped`); ungrouped, the matrix is the one group.
#[cube]
fn tile_group(
    group_start: &Array<u32>,
    group_rows: &Array<u32>,
    groups: usize,
    rows: usize,
    tile_row: usize,
    #[comptime] grouped: bool,
) -> (usize, usize) {
    let (_g, g_start, g_rows) =
        group_of_row(group_start, group_rows, groups, rows, tile_row * BLOCK_TILE, grouped);
    (g_start, g_rows)
}

/// Where the columnwise `scale_inv` of column block `c` (1x128: a column; 128x128: a tile
/// column) of tile row `tile_row` goes: its group's scales follow the earlier groups', each
/// group transposed on its own (`[cols, rows_g / 128]` or `[cols / 128, rows_g / 128]`).
#[cube]
fn columnwise_scale_index(
    c: usize,
    tile_row: usize,
    g_start: usize,
    g_rows: usize,
    cols: usize,
    #[comptime] block_2d: bool,
) -> usize {
    let row_len = if comptime![block_2d] {
        cols / BLOCK_TILE
    } else {
        cols
    };
    (g_start / BLOCK_TILE) * row_len + c * (g_rows / BLOCK_TILE) + tile_row - g_start / BLOCK_TILE
}

/// FP8 block scaling (1x128 or 128x128). Needs `M % 128 == 0` and `K % 128 == 0`.
pub fn quantize_fp8_block<R: Runtime>(
    client: &ComputeClient<R>,
    x: InputMatrix,
    rule: ScaleRule,
    block_2d: bool,
    directions: Directions,
    groups: Option<RowGroups>,
) -> Result<QuantizeOutput, KernelError> {
    x.require_blocks(BLOCK_TILE, BLOCK_TILE, "FP8 block scaling")?;
    require_grouped_rows(&x, groups)?;
    let n = x.rows * x.cols;
    let (mb, kb) = (x.rows / BLOCK_TILE, x.cols / BLOCK_TILE);
    let (row_scales, col_scales) = if block_2d {
        (mb * kb, mb * kb)
    } else {
        (x.rows * kb, x.cols * mb)
    };
    let buffers = CastBuffers::new(
        client,
        directions,
        n,
        (|| client.empty(row_scales * 4), row_scales),
        (|| client.empty(col_scales * 4), col_scales),
    );
    let config = Fp8BlockKernelConfig {
        kind: x.kind,
        rule,
        block_2d,
        unroll: unroll(client),
        grouped: groups.is_some(),
        encoder: fp8_encoder(client),
    };
    let (group_start, group_rows, count) = group_args(client, groups);
    // Both kernels take the same arguments.
    macro_rules! launch_block {
        ($kernel:ident, $units:expr) => {
            unsafe {
                $kernel::launch_unchecked::<R>(
                    client,
                    CubeCount::Static(kb as u32, mb as u32, 1),
                    CubeDim::new_1d($units as u32),
                    INPUT_VECTOR,
                    x.arg(),
                    buffers.arg(),
                    group_start,
                    group_rows,
                    x.rows,
                    x.cols,
                    count,
                    directions.flags(),
                    config,
                )
            }
        };
    }
    if directions.columnwise && x.kind != ElemKind::F32 && !tile_kernels_forced() {
        // 16-bit input with the transposed copy: units shaped for the transposed stores.
        launch_block!(fp8_block_transposed_kernel, TRANSPOSED_UNITS);
    } else {
        launch_block!(fp8_block_kernel, BLOCK_UNITS);
    }
    Ok(buffers.into_output(directions, None))
}
