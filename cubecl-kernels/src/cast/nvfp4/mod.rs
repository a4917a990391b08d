//! NVFP4: E2M1 codes with E4M3 scales per 1x16 block (or 16x16 tile) under an f32 global scale,
//! rowwise `[M, K/2]` and transposed columnwise `[K, M/2]` from one read, optional random Hadamard
//! transform on the columnwise copy and stochastic rounding. The global amaxes come from the amax
//! pass (`cast::amax`). Host reference: `burn_lowp::format::nvfp4`.
//!
//! Three kernels, chosen by the launcher (`quantize_nvfp4`), all giving the same bytes:
//! - `nvfp4_kernel`: a cube of 256 units stages a 64 x 64 tile in shared memory as f32; then
//!   every unit quantizes one rowwise block (16 columns of a row) and one columnwise block (16
//!   rows of a column, where the RHT runs), each from 16 registers. f32 inputs and stochastic
//!   rounding with the columnwise copy.
//! - `nvfp4_rowwise_kernel`: 1D rowwise-only casts, one unit per two blocks, no shared memory.
//! - `nvfp4_strip_kernel`: the other 16-bit cases, one unit per 16 rows x 8 columns.
//!
//! The element work bounds NVFP4 on Hopper (no E2M1 conversion instruction): the two newer
//! kernels take the branch-free `encode_e2m1_not_nan` and the two-instruction `nan_free_amax`.
//!
//! This module holds the kernels' configuration and the launcher that picks one; `blocks` the
//! in-kernel steps they share.

use cubecl::prelude::*;

use crate::cast::amax::{amax, amax_with_rht, group_amax};
use crate::cast::flags::SWIZZLED;
use crate::cast::kernel_choice::{tile_kernels_forced, unroll};
use crate::cast::output::{scale_bytes, CastBuffers, Directions, QuantizeOutput};
use crate::grouped::group_layout::{group_args, require_grouped_rows, RowGroups};
use crate::util::buffers::{arg, filled};
use crate::util::elements::ElemKind;
use crate::util::error::{require, KernelError};
use crate::util::grid::{ceil_div, linear_cubes, round_up};
use crate::util::matrix::{INPUT_VECTOR, InputMatrix};

pub mod blocks;
pub mod rowwise;
pub mod strip;
pub mod tile;

use rowwise::{nvfp4_rowwise_kernel, NV_ROWWISE_ELEMENTS, NV_ROWWISE_UNITS};
use strip::{nvfp4_strip_kernel, NV_STRIP_TILE_COLS, NV_STRIP_TILE_ROWS, NV_STRIP_UNITS};
use tile::{nvfp4_kernel, NV_TILE, NV_UNITS};

#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub struct Nvfp4KernelConfig {
    pub kind: ElemKind,
    pub block_2d: bool,
    pub rht: bool,
    /// Rows form groups (multiples of 64 rows), each with its own global amaxes and random
    /// streams (keys), and its own transposed columnwise block: codes `[cols, rows_g / 2]` at
    /// byte `start_g * cols / 2`, scales `[roundup(cols, 128), rows_g / 16]` at
    /// `start_g / 16` scale columns' worth; stochastic rounding counts elements within the group.
    pub grouped: bool,
    /// Stochastic rounding (the `STOCHASTIC` flag as a compile-time choice, so that the
    /// round-to-nearest kernels carry no stochastic-rounding code: a rarely taken branch per
    /// element still filled the instruction cache).
    pub stochastic: bool,
    /// Fully unroll `nvfp4_strip_kernel`'s per-row and per-column loops (fast code; slow to
    /// compile on lavapipe). `nvfp4_kernel` ignores it.
    pub unroll: bool,
}

/// Byte sizes of NVFP4 compact scales: rowwise `[roundup(M,128), roundup(K/16,4)]`, columnwise
/// `[roundup(K,128), roundup(M/16,4)]`.
pub fn nvfp4_scale_shapes(rows: usize, cols: usize) -> ([usize; 2], [usize; 2]) {
    (
        [round_up(rows, 128), round_up(cols / 16, 4)],
        [round_up(cols, 128), round_up(rows / 16, 4)],
    )
}

/// NVFP4 options.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Nvfp4Options {
    pub block_2d: bool,
    pub rht: bool,
    /// Stochastic rounding keys (rowwise, columnwise) from
    /// `burn_lowp::format::random::stream_key`: one pair, or one per group when grouped.
    pub stochastic_keys: Option<Vec<(u32, u32)>>,
}

/// NVFP4: amax pass (with the post-RHT amax when `rht`), then one quantize launch. Needs
/// `M % 16 == 0` and `K % 16 == 0`; 2D blocks and RHT cannot be combined. With `groups`, each
/// group gets its own global amaxes and random streams (no swizzled scales).
///
/// Kernels: `nvfp4_rowwise_kernel` for 1D rowwise-only casts (`K % 32 == 0`, not grouped),
/// `nvfp4_strip_kernel` for the other 16-bit cases without stochastic rounding,
/// `nvfp4_kernel` (64x64 tiles staged in shared memory) for the rest (f32 inputs, stochastic
/// rounding with the columnwise copy); all give the same bytes.
pub fn quantize_nvfp4<R: Runtime>(
    client: &ComputeClient<R>,
    x: InputMatrix,
    options: &Nvfp4Options,
    directions: Directions,
    swizzled: bool,
    groups: Option<RowGroups>,
) -> Result<QuantizeOutput, KernelError> {
    x.require_blocks(16, 16, "NVFP4")?;
    require_grouped_rows(&x, groups)?;
    require(
        !(options.block_2d && options.rht),
        "16x16 blocks with RHT",
        "NVFP4 applies RHT to 1x16 activations and gradients only",
    )?;
    require(
        !(swizzled && groups.is_some()),
        "swizzled scales of a grouped matrix",
        "grouped NVFP4 writes compact scales",
    )?;
    let count = groups.map_or(1, |g| g.count);
    if let Some(keys) = &options.stochastic_keys {
        require(
            keys.len() == count,
            format!("{} stochastic-rounding key pairs", keys.len()),
            format!("one per group ({count})"),
        )?;
    }
    let post_rht = options.rht && directions.columnwise;
    let (rowwise_amax, columnwise_amax) = match (groups, post_rht) {
        (Some(g), true) => group_amax(client, x, g, true)?,
        (Some(g), false) => {
            let a = group_amax(client, x, g, false)?.0;
            (a.clone(), a)
        }
        (None, true) => amax_with_rht(client, x)?,
        (None, false) => {
            let a = amax(client, x)?;
            (a.clone(), a)
        }
    };
    let n = x.rows * x.cols;
    let (row_shape, col_shape) = nvfp4_scale_shapes(x.rows, x.cols);
    // A grouped matrix's compact scales keep their fill.
    let whole = groups.is_none();
    let buffers = CastBuffers::new(
        client,
        directions,
        n / 2,
        (
            || scale_bytes(client, row_shape, whole.then_some([x.rows, x.cols / 16])),
            row_shape[0] * row_shape[1],
        ),
        (
            || scale_bytes(client, col_shape, whole.then_some([x.cols, x.rows / 16])),
            col_shape[0] * col_shape[1],
        ),
    );
    // Without stochastic rounding the kernel reads no key: zeroed words from the arena, no upload.
    let keys = match &options.stochastic_keys {
        Some(keys) => {
            let key_words: Vec<u32> = keys.iter().flat_map(|&(r, c)| [r, c]).collect();
            client.create_from_slice(u32::as_bytes(&key_words))
        }
        None => filled(client, 2 * count, 0),
    };
    let config = Nvfp4KernelConfig {
        kind: x.kind,
        block_2d: options.block_2d,
        rht: options.rht,
        grouped: groups.is_some(),
        stochastic: options.stochastic_keys.is_some(),
        unroll: unroll(client),
    };
    let flags = directions.flags() | if swizzled { SWIZZLED } else { 0 };
    let (group_start, group_rows, count) = group_args(client, groups);
    let rowwise_only_1d = directions.rowwise
        && !directions.columnwise
        && !options.block_2d
        && groups.is_none()
        && x.cols % NV_ROWWISE_ELEMENTS == 0;
    // Stochastic rounding with the columnwise copy stays on the tile kernel: the strip kernel
    // holds 217 registers there and took 709 / 1607 us (columnwise / both, 16384x8192 bf16,
    // H100) against the tile kernel's 574 / 868 us (`benches/results/nvfp4-h100/call4`).
    let stochastic_columnwise = options.stochastic_keys.is_some() && directions.columnwise;
    // The tile and strip kernels take the same arguments, the strip kernel's directions last.
    macro_rules! launch_tiles {
        ($kernel:ident, $tile_cols:expr, $tile_rows:expr, $units:expr $(, $directions:expr)*) => {
            unsafe {
                $kernel::launch_unchecked::<R>(
                    client,
                    CubeCount::Static(
                        ceil_div(x.cols, $tile_cols) as u32,
                        ceil_div(x.rows, $tile_rows) as u32,
                        1,
                    ),
                    CubeDim::new_1d($units as u32),
                    INPUT_VECTOR,
                    x.arg(),
                    arg(&rowwise_amax, count),
                    arg(&columnwise_amax, count),
                    arg(&keys, 2 * count),
                    group_start,
                    group_rows,
                    buffers.arg(),
                    x.rows,
                    x.cols,
                    count,
                    flags,
                    config,
                    $($directions,)*
                )
            }
        };
    }
    if tile_kernels_forced()
        || (x.kind == ElemKind::F32 && !rowwise_only_1d)
        || stochastic_columnwise
    {
        launch_tiles!(nvfp4_kernel, NV_TILE, NV_TILE, NV_UNITS);
    } else if rowwise_only_1d {
        // The forward activation's cast: one unit per two 1x16 blocks, no shared memory.
        let (codes, scales) = buffers.rowwise_args();
        unsafe {
            nvfp4_rowwise_kernel::launch_unchecked::<R>(
                client,
                linear_cubes(client, (n / NV_ROWWISE_ELEMENTS).div_ceil(NV_ROWWISE_UNITS)),
                CubeDim::new_1d(NV_ROWWISE_UNITS as u32),
                INPUT_VECTOR,
                x.arg(),
                arg(&rowwise_amax, 1),
                arg(&keys, 2),
                codes,
                scales,
                x.rows,
                x.cols,
                flags,
                config,
            )
        };
    } else {
        // 16-bit input with the columnwise copy, 2D blocks or row groups: one unit per 16x8 strip.
        launch_tiles!(
            nvfp4_strip_kernel,
            NV_STRIP_TILE_COLS,
            NV_STRIP_TILE_ROWS,
            NV_STRIP_UNITS,
            directions.rowwise,
            directions.columnwise
        );
    }
    Ok(buffers.into_output(directions, Some([rowwise_amax, columnwise_amax])))
}
