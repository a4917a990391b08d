//! Tensor statistics for the precision debug tools, in one read of the tensor: each cube takes a
//! 32x32 tile, each of its 32 units one row of the tile (one 1D block of 32 elements along the
//! last dimension), and the cube writes the tile's partial statistics (`STAT_FIELDS` f32). A
//! second launch folds the tiles into records of 128 rows x 2048 columns (`stats_records_kernel`),
//! so that what the host reads and reduces is 256 times smaller than the tiles: a sampling step of
//! the MoE example produced about 217 MB of tiles. The host reduces the records
//! (`burn_lowp::debug::stats`, which also holds the reference these kernels are tested against).
//!
//! With the dequantized copy of the tensor (f32, same layout) it also counts underflows (non-zero
//! inputs that quantize to zero) and sums the squared quantization error; with an overflow limit
//! (delayed scaling's `fp8_max · scale_inv`, one f32 per group on the device) it counts
//! `|x| > limit`.
//!
//! The quantized copy can also come as FP8 codes (per-tensor or block scales, one group or the
//! groups of a grouped tensor), decoded in the pass exactly as `dequantize_fp8_kernel` and
//! `dequantize_fp8_grouped_kernel` decode them, with the per-tensor overflow limit
//! `fp8_max · scale_inv` formed in the pass as the debug layer forms it on the host side
//! (`StatsError::Fp8Codes`). The records are then bit-equal to those of the dequantized copy, and
//! a debug observation saves the dequantize launch, its f32 copy and the limit's launches: a
//! sampling step of the MoE example is bound by how many launches it hands CubeCL's device thread.
//!
//! Grouped tensors (an MoE layer's experts, one launch for all of them): with row labels (the
//! group of each row, `groups` or more for padding rows, which fold nothing) every tile writes the
//! group it belongs to (`GROUP`) and how many elements it folded (`ELEMENTS`), so the host splits
//! the partials per group after the read without knowing the split sizes when it launches. Tiles
//! never straddle two groups: groups start at multiples of 128 rows (`format::grouped`).

use crate::cast::codec::Fp8Kind;
use crate::cast::dequantize::Fp8Scales;
use crate::grouped::group_layout::RowGroups;
use crate::util::buffers::arg;
use crate::util::error::KernelError;
use crate::util::matrix::InputMatrix;
use crate::util::reduce::planes_of_32;

use cubecl::prelude::*;

/// Rows and columns of a tile; units per cube.
pub const STATS_TILE: usize = 32;
/// f32 fields per tile in the output.
pub const STAT_FIELDS: usize = 16;
/// Field indices. Counts are exact (at most 1024 per tile).
pub const NONZERO: usize = 0;
pub const SUM: usize = 1;
pub const SUM_SQUARES: usize = 2;
pub const ABS_SUM: usize = 3;
pub const MIN: usize = 4;
pub const MAX: usize = 5;
pub const AMAX: usize = 6;
/// Smallest non-zero `|x|` (+inf when the tile has none).
pub const MIN_NONZERO_ABS: usize = 7;
/// Max over the tile's 1D blocks of `ln(block amax) - ln(block min non-zero |x|)` (0 for a block
/// of zeros); the tile's own (2D, 32x32) range.
pub const MAX_LN_RANGE_1D: usize = 8;
pub const LN_RANGE_2D: usize = 9;
pub const UNDERFLOWS: usize = 10;
/// `Σ (x - dq)²` over the pairs whose difference is finite.
pub const SQUARED_ERROR: usize = 11;
pub const OVERFLOWS: usize = 12;
/// The tile's group (0 without labels; `groups` for a tile of padding rows only).
pub const GROUP: usize = 13;
/// Elements the tile folded (padding rows left out).
pub const ELEMENTS: usize = 14;

pub mod fields;
pub mod records;
pub mod tiles;

use records::stats_records_kernel;
use tiles::tensor_stats_kernel;

/// Tiles of a `[rows, cols]` tensor.
pub fn stats_tiles(rows: usize, cols: usize) -> usize {
    rows.div_ceil(STATS_TILE) * cols.div_ceil(STATS_TILE)
}

/// Tile rows of a record: 128 rows, the grouped layouts' alignment, so that a record never holds
/// two groups' rows (only a group's rows and padding rows, whose tiles fold nothing).
pub const RECORD_TILE_ROWS: usize = 4;
/// Tile columns of a record: 2048 columns, so that a record folds at most 2^18 elements and its
/// counts stay exact in f32.
pub const RECORD_TILE_COLS: usize = 64;

/// Records of a `[rows, cols]` tensor's statistics (row-major over 128x2048 blocks).
pub fn stats_records(rows: usize, cols: usize) -> usize {
    rows.div_ceil(STATS_TILE).div_ceil(RECORD_TILE_ROWS) * cols.div_ceil(STATS_TILE).div_ceil(RECORD_TILE_COLS)
}

/// Row labels of a grouped statistics input: the i32 group of each row (`count` or more: left
/// out).
#[derive(Clone, Copy)]
pub struct RowLabels<'a> {
    pub row_group: &'a cubecl::server::Handle,
    pub count: usize,
}

/// The quantized copy a statistics pass measures `x` against.
#[derive(Clone, Copy)]
pub enum StatsError<'a> {
    /// The f32 dequantized copy (x's layout) and the f32 overflow limits (one, or one per group
    /// with labels).
    Dequantized {
        values: &'a cubecl::server::Handle,
        limits: &'a cubecl::server::Handle,
    },
    /// FP8 codes and their f32 scales, laid out as `dequantize_fp8_grouped` reads them (its
    /// groups with labels; else one group of `code_rows` storage rows), decoded in the pass; the
    /// overflow limit of a per-tensor scale is `fp8_max · scale_inv`, block scales have none.
    /// `copy` is the rowwise or the columnwise copy, or both (measured in the one read of x:
    /// `tensor_stats` then returns the rowwise records, then the columnwise).
    Fp8Codes {
        copy: Fp8Copy<'a>,
        groups: Option<RowGroups<'a>>,
        code_rows: usize,
        fp8: Fp8Kind,
        fp8_max: f32,
        scales_kind: Fp8Scales,
    },
}

/// The FP8 codes and f32 scales of one copy.
#[derive(Clone, Copy)]
pub struct Fp8Codes<'a> {
    pub codes: &'a cubecl::server::Handle,
    pub scales: &'a cubecl::server::Handle,
}

/// Which copies of a tensor a decoding statistics pass measures.
#[derive(Clone, Copy)]
pub enum Fp8Copy<'a> {
    Rowwise(Fp8Codes<'a>),
    Columnwise(Fp8Codes<'a>),
    Both { rowwise: Fp8Codes<'a>, columnwise: Fp8Codes<'a> },
}

/// The f32 `[records, STAT_FIELDS]` partial statistics of `x` (`cols` even; `stats_records`):
/// the tiles of one launch folded into records by a second; with `error`, the quantization terms
/// against that copy: one set of records per copy measured, one after the other in the buffer
/// returned (rowwise first when both). The cube reductions run as warp shuffles where planes are
/// 32 lanes wide (`planes_of_32`), else through shared memory: the same trees either way.
pub fn tensor_stats<R: Runtime>(
    client: &ComputeClient<R>,
    x: InputMatrix,
    error: Option<StatsError<'_>>,
    labels: Option<RowLabels<'_>>,
) -> Result<cubecl::server::Handle, KernelError> {
    tensor_stats_with_trees(client, x, error, labels, planes_of_32(client))
}

/// `tensor_stats` with its reductions as plane shuffles (`planes`; only where `planes_of_32`) or
/// through shared memory (anywhere), so a test can hold one against the other.
pub fn tensor_stats_with_trees<R: Runtime>(
    client: &ComputeClient<R>,
    x: InputMatrix,
    error: Option<StatsError<'_>>,
    labels: Option<RowLabels<'_>>,
    planes: bool,
) -> Result<cubecl::server::Handle, KernelError> {
    if planes && !planes_of_32(client) {
        return Err(KernelError {
            value: "plane reductions".into(),
            rule: "need planes of exactly 32 lanes with plane operations".into(),
        });
    }
    if x.rows == 0 || x.cols == 0 || x.cols % 2 != 0 || x.rows * x.cols >= u32::MAX as usize {
        return Err(KernelError {
            value: format!("shape [{}, {}]", x.rows, x.cols),
            rule: "tensor statistics need a non-empty matrix with an even last dimension".into(),
        });
    }
    let tiles = stats_tiles(x.rows, x.cols);
    let elements = x.rows * x.cols;
    let words = elements * x.kind.bytes() / 4;
    // Arrays a launch does not read: any buffer will do (one element of x's).
    let unread = || arg(x.handle, 1);
    let groups = labels.map_or(1, |l| l.count);
    let row_group = match labels {
        Some(l) => arg(l.row_group, x.rows),
        None => unread(),
    };
    // The comptime decode (decoded, fp8, rows per scale block, transposed), the arrays of the
    // copies (values and scales of the first, then of the second), the groups' starts and
    // lengths, and the codes' rows and FP8 maximum.
    let mut decode = (false, Fp8Kind::E4M3, 0usize, false);
    let (mut start, mut len) = (unread(), unread());
    let (mut code_rows, mut fp8_max) = (x.rows, 0.0f32);
    let (copies, first, second) = match error {
        None => (0usize, (unread(), unread()), (unread(), unread())),
        Some(StatsError::Dequantized { values, limits }) => (
            1,
            (arg(values, elements), arg(limits, groups)),
            (unread(), unread()),
        ),
        Some(StatsError::Fp8Codes {
            copy,
            groups: code_groups,
            code_rows: rows_of_codes,
            fp8,
            fp8_max: max,
            scales_kind,
        }) => {
            if code_groups.is_some() != labels.is_some() || rows_of_codes < x.rows {
                return Err(KernelError {
                    value: format!("{} code rows, grouped codes {}, labels {}", rows_of_codes, code_groups.is_some(), labels.is_some()),
                    rule: "decoded statistics need codes for every row of x, grouped exactly when the rows are labelled".into(),
                });
            }
            let spb = scales_kind.rows_per_block();
            if let Some(g) = code_groups {
                (start, len) = g.args();
            }
            code_rows = rows_of_codes;
            fp8_max = max;
            let scale_words = if spb == 0 { groups } else { rows_of_codes * x.cols / (128 * spb) }.max(1);
            let arrays = |c: Fp8Codes<'_>| {
                (
                    arg(c.codes, (rows_of_codes * x.cols).div_ceil(4)),
                    arg(c.scales, scale_words),
                )
            };
            let (copies, transposed, first, second) = match copy {
                Fp8Copy::Rowwise(c) => (1, false, arrays(c), (unread(), unread())),
                Fp8Copy::Columnwise(c) => (1, true, arrays(c), (unread(), unread())),
                Fp8Copy::Both { rowwise, columnwise } => (2, false, arrays(rowwise), arrays(columnwise)),
            };
            decode = (true, fp8, spb, transposed);
            (copies, first, second)
        }
    };
    let sets = copies.max(1);
    let tile_partials = client.empty(sets * tiles * STAT_FIELDS * 4);
    unsafe {
        tensor_stats_kernel::launch_unchecked::<R>(
            client,
            cubecl::server::CubeCountSelection::new(client, tiles as u32).cube_count(),
            CubeDim::new_1d(STATS_TILE as u32),
            ArrayArg::from_raw_parts(x.handle.clone(), words),
            first.0,
            first.1,
            second.0,
            second.1,
            row_group,
            start,
            len,
            ArrayArg::from_raw_parts(tile_partials.clone(), sets * tiles * STAT_FIELDS),
            x.rows,
            x.cols,
            tiles,
            groups,
            code_rows,
            fp8_max,
            0u32,
            f32::INFINITY,
            x.kind,
            copies,
            labels.is_some(),
            decode.0,
            decode.1,
            decode.2,
            decode.3,
            planes,
        )
    };
    let records = stats_records(x.rows, x.cols);
    let out = client.empty(sets * records * STAT_FIELDS * 4);
    unsafe {
        stats_records_kernel::launch_unchecked::<R>(
            client,
            cubecl::server::CubeCountSelection::new(client, (sets * records) as u32).cube_count(),
            CubeDim::new_1d(STATS_TILE as u32),
            ArrayArg::from_raw_parts(tile_partials, sets * tiles * STAT_FIELDS),
            ArrayArg::from_raw_parts(out.clone(), sets * records * STAT_FIELDS),
            x.rows.div_ceil(STATS_TILE),
            x.cols.div_ceil(STATS_TILE),
            records,
            sets,
            f32::INFINITY,
            planes,
        )
    };
    Ok(out)
}
