//! `mxfp8_rowwise_kernel`, MXFP8 for the rowwise copy alone with 1D blocks.

use cubecl::prelude::*;

use crate::cast::codec::{e8m0_reciprocal, encode_fp8_by, float_to_e8m0};
use crate::cast::flags::SWIZZLED;
use crate::cast::mxfp8::{pack4, padded_row_scale_cols, Mxfp8Config};
use crate::cast::swizzle::scale_index;
use crate::util::elements::{abs_bits_for_amax, load_chunk};

/// Units per cube of the rowwise-only MXFP8 kernel (one unit per 32-element block).
pub(crate) const MX_ROWWISE_UNITS: usize = 256;

/// Rowwise-only MXFP8 with 1D blocks: one unit per 32-element block of a row, so the block's
/// amax stays in registers (no shared memory, no cube barrier) and the units of a warp cover 32
/// consecutive blocks of a row (2 KiB of bf16 in, 1 KiB of codes out, written as 16-byte
/// vectors). Same codes and scales as `mxfp8_kernel`; the launcher picks it when only rowwise
/// data is asked for (the forward activation of a GEMM on Blackwell).
#[cube(launch_unchecked)]
pub fn mxfp8_rowwise_kernel<N: Size>(
    input: &Array<Vector<u32, N>>,
    codes: &mut Array<Vector<u32, N>>,
    scales: &mut Array<u8>,
    rows: usize,
    cols: usize,
    flags: u32,
    #[comptime] config: Mxfp8Config,
) {
    let blocks_per_row = cols / 32;
    let block = ABSOLUTE_POS;
    if block < rows * blocks_per_row {
        let row = block / blocks_per_row;
        let kb = block % blocks_per_row;
        let start = row * cols + kb * 32;
        let mut values = Array::<f32>::new(32usize);
        #[unroll]
        for i in 0..4usize {
            load_chunk::<N>(input, start + i * 8, &mut values, i * 8, config.kind);
        }
        let mut amax = 0u32;
        #[unroll]
        for i in 0..32usize {
            amax = max(amax, abs_bits_for_amax(values[i]));
        }
        let reciprocal_max = f32::new(comptime![f32::from_bits(config.reciprocal_max_bits)]);
        let e = float_to_e8m0(f32::reinterpret(amax) * reciprocal_max);
        scales[scale_index(row, kb, padded_row_scale_cols(cols), (flags & SWIZZLED) != 0u32)] =
            u8::cast_from(e);
        let multiplier = e8m0_reciprocal(e);
        let mut block_codes = Array::<u32>::new(32usize);
        #[unroll]
        for i in 0..32usize {
            block_codes[i] = encode_fp8_by(values[i] * multiplier, config.fp8, config.encoder);
        }
        #[unroll]
        for half in 0..2usize {
            let mut packed = Vector::<u32, N>::empty();
            #[unroll]
            for w in 0..4usize {
                packed[w] = pack4(&block_codes, half * 16 + w * 4);
            }
            codes[start / 16 + half] = packed;
        }
    }
}
