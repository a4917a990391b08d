//! `stats_records_kernel`: the tiles of a statistics launch folded into records of 128 rows x
//! 2048 columns, the partials the host reads.

use cubecl::prelude::*;

use crate::stats::{
    ABS_SUM, AMAX, ELEMENTS, GROUP, LN_RANGE_2D, MAX, MAX_LN_RANGE_1D, MIN, MIN_NONZERO_ABS,
    NONZERO, OVERFLOWS, RECORD_TILE_COLS, RECORD_TILE_ROWS, SQUARED_ERROR, STATS_TILE, STAT_FIELDS,
    SUM, SUM_SQUARES, UNDERFLOWS,
};
use crate::stats::fields::{cube_fold_fields, empty_fields};

/// Folds one tile's partials (at `t` in `tiles`) into a unit's record accumulators: sums and
/// counts add, extremes and ranges take their max or min, the group its min (a tile of padding
/// rows only names `groups`, past every real group).
#[cube]
fn fold_tile(tiles: &Array<f32>, t: usize, acc: &mut Array<f32>) {
    acc[NONZERO] += tiles[t + NONZERO];
    acc[SUM] += tiles[t + SUM];
    acc[SUM_SQUARES] += tiles[t + SUM_SQUARES];
    acc[ABS_SUM] += tiles[t + ABS_SUM];
    acc[UNDERFLOWS] += tiles[t + UNDERFLOWS];
    acc[SQUARED_ERROR] += tiles[t + SQUARED_ERROR];
    acc[OVERFLOWS] += tiles[t + OVERFLOWS];
    acc[ELEMENTS] += tiles[t + ELEMENTS];
    // Comparisons, not fmin/fmax, so that the host's reference picks the same value.
    if tiles[t + MIN] < acc[MIN] {
        acc[MIN] = tiles[t + MIN];
    }
    if tiles[t + MIN_NONZERO_ABS] < acc[MIN_NONZERO_ABS] {
        acc[MIN_NONZERO_ABS] = tiles[t + MIN_NONZERO_ABS];
    }
    if tiles[t + GROUP] < acc[GROUP] {
        acc[GROUP] = tiles[t + GROUP];
    }
    if tiles[t + MAX] > acc[MAX] {
        acc[MAX] = tiles[t + MAX];
    }
    if tiles[t + AMAX] > acc[AMAX] {
        acc[AMAX] = tiles[t + AMAX];
    }
    if tiles[t + MAX_LN_RANGE_1D] > acc[MAX_LN_RANGE_1D] {
        acc[MAX_LN_RANGE_1D] = tiles[t + MAX_LN_RANGE_1D];
    }
    if tiles[t + LN_RANGE_2D] > acc[LN_RANGE_2D] {
        acc[LN_RANGE_2D] = tiles[t + LN_RANGE_2D];
    }
}

/// Records (same fields as the tiles) of the `[tile_rows, tile_cols]` tiles of a statistics
/// launch: one cube per record of up to `RECORD_TILE_ROWS x RECORD_TILE_COLS` tiles; unit u folds
/// the record's tiles u, u + 32, ... (row-major within the record) in that order, then the cube
/// sums the units' accumulators by the fixed tree of `cube_sum`. The host's reference
/// (`burn_lowp::debug::stats::record_partials`) folds in the same order. `copies` sets of tiles
/// (one per measured copy, `tile_rows * tile_cols` each) give as many sets of records.
#[cube(launch_unchecked)]
pub fn stats_records_kernel(
    tiles: &Array<f32>,
    out: &mut Array<f32>,
    tile_rows: usize,
    tile_cols: usize,
    records: usize,
    copies: usize,
    infinity: f32,
    #[comptime] planes: bool,
) {
    let mut scratch = SharedMemory::<f32>::new(STATS_TILE);
    let mut acc = Array::<f32>::new(STAT_FIELDS);
    empty_fields(&mut acc, infinity);
    let copy = CUBE_POS as usize / records;
    let copy_tiles = copy * tile_rows * tile_cols;
    let mut record = CUBE_POS as usize % records;
    if copy >= copies {
        record = records;
    }
    // The record's tiles: rows [first_row, first_row + span_rows) x columns [first_col, + span_cols).
    let mut span_rows = 0usize;
    let mut span_cols = 1usize;
    let mut first_row = 0usize;
    let mut first_col = 0usize;
    if record < records {
        let record_cols = tile_cols.div_ceil(RECORD_TILE_COLS);
        first_row = (record / record_cols) * RECORD_TILE_ROWS;
        first_col = (record % record_cols) * RECORD_TILE_COLS;
        span_rows = RECORD_TILE_ROWS;
        if first_row + span_rows > tile_rows {
            span_rows = tile_rows - first_row;
        }
        span_cols = RECORD_TILE_COLS;
        if first_col + span_cols > tile_cols {
            span_cols = tile_cols - first_col;
        }
    }
    for i in range_stepped(UNIT_POS as usize, span_rows * span_cols, STATS_TILE) {
        let tile = copy_tiles + (first_row + i / span_cols) * tile_cols + first_col + i % span_cols;
        fold_tile(tiles, tile * STAT_FIELDS, &mut acc);
    }
    let mut fields = Array::<f32>::new(STAT_FIELDS);
    cube_fold_fields(&acc, &mut fields, &mut scratch, true, planes);
    if record < records && UNIT_POS == 0 {
        #[unroll]
        for i in 0..STAT_FIELDS {
            out[(copy * records + record) * STAT_FIELDS + i] = fields[i];
        }
    }
}
