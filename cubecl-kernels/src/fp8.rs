//! FP8 per-tensor quantization (current or delayed scaling): rowwise codes `[M, K]` and, in the
//! same launch, the physically transposed columnwise codes `[K, M]` (Hopper's FP8 GEMM is TN-only).
//! Host reference: `burn_lowp::format::fp8_tensor`.
//!
//! Tiling: a cube of 256 units covers 32 rows x 256 columns; each unit owns 4 rows x 8 columns,
//! so it writes 2 rowwise words per row and one columnwise word (4 codes along M) per column.
//! Units are numbered row-group first, so the 8 units of a column write one contiguous 32-byte
//! run of the transposed output.

use crate::codec::{abs_bits_for_amax, encode_fp8, load_chunk, ElemKind, Fp8Kind};
use crate::reduce::cube_max_into;
use crate::scale::{scale_from_amax, ScaleRule};
use cubecl::prelude::*;

pub const FP8_ROWS_PER_UNIT: usize = 4;
pub const FP8_ROW_GROUPS: usize = 8;
pub const FP8_STRIPS: usize = 32;
pub const FP8_UNITS: usize = FP8_ROW_GROUPS * FP8_STRIPS;
pub const FP8_TILE_ROWS: usize = FP8_ROWS_PER_UNIT * FP8_ROW_GROUPS;
pub const FP8_TILE_COLS: usize = 8 * FP8_STRIPS;

#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub struct Fp8CastConfig {
    pub kind: ElemKind,
    pub fp8: Fp8Kind,
    /// `scale_source[0]` is the tensor amax (current scaling) rather than the scale (delayed).
    pub from_amax: bool,
    pub rule: ScaleRule,
    pub rowwise: bool,
    pub columnwise: bool,
    /// Record this tensor's amax into `amax_out` (delayed scaling history).
    pub record_amax: bool,
}

#[cube(launch_unchecked)]
pub fn fp8_cast_kernel<N: Size>(
    input: &Array<Vector<u32, N>>,
    scale_source: &Array<u32>,
    rowwise: &mut Array<u32>,
    columnwise: &mut Array<u32>,
    scale_inv_out: &mut Array<u32>,
    amax_out: &mut Array<Atomic<u32>>,
    rows: usize,
    cols: usize,
    #[comptime] config: Fp8CastConfig,
) {
    let unit = UNIT_POS as usize;
    let group = unit % FP8_ROW_GROUPS;
    let strip = unit / FP8_ROW_GROUPS;
    let row0 = CUBE_POS_Y as usize * FP8_TILE_ROWS + group * FP8_ROWS_PER_UNIT;
    let col0 = CUBE_POS_X as usize * FP8_TILE_COLS + strip * 8;
    let active = row0 < rows && col0 < cols;

    let source = f32::reinterpret(scale_source[0]);
    let scale = if comptime![config.from_amax] {
        scale_from_amax(source, config.rule)
    } else {
        source
    };

    let mut local_amax = 0u32;
    if active {
        let mut values = Array::<f32>::new(32usize);
        #[unroll]
        for i in 0..4usize {
            load_chunk::<N>(
                input,
                (row0 + i) * cols + col0,
                &mut values,
                i * 8,
                config.kind,
            );
        }
        let mut codes = Array::<u32>::new(32usize);
        #[unroll]
        for i in 0..32usize {
            if comptime![config.record_amax] {
                let a = abs_bits_for_amax(values[i]);
                if a > local_amax {
                    local_amax = a;
                }
            }
            codes[i] = encode_fp8(values[i] * scale, config.fp8);
        }
        if comptime![config.rowwise] {
            #[unroll]
            for i in 0..4usize {
                let word = ((row0 + i) * cols + col0) / 4;
                rowwise[word] = codes[i * 8]
                    | (codes[i * 8 + 1] << 8u32)
                    | (codes[i * 8 + 2] << 16u32)
                    | (codes[i * 8 + 3] << 24u32);
                rowwise[word + 1] = codes[i * 8 + 4]
                    | (codes[i * 8 + 5] << 8u32)
                    | (codes[i * 8 + 6] << 16u32)
                    | (codes[i * 8 + 7] << 24u32);
            }
        }
        if comptime![config.columnwise] {
            #[unroll]
            for j in 0..8usize {
                let word = ((col0 + j) * rows + row0) / 4;
                columnwise[word] = codes[j]
                    | (codes[8 + j] << 8u32)
                    | (codes[16 + j] << 16u32)
                    | (codes[24 + j] << 24u32);
            }
        }
    }
    if comptime![config.record_amax] {
        let mut scratch = SharedMemory::<u32>::new(FP8_UNITS);
        cube_max_into(local_amax, &mut scratch, amax_out, FP8_UNITS);
    }
    if CUBE_POS == 0 && unit == 0 {
        scale_inv_out[0] = u32::reinterpret(1.0f32 / scale);
    }
}
