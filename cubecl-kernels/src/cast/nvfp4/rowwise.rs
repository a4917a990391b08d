//! `nvfp4_rowwise_kernel`: NVFP4 for the rowwise copy alone with 1x16 blocks, one unit per two
//! blocks, no shared memory.

use cubecl::prelude::*;

use crate::cast::flags::SWIZZLED;
use crate::cast::nvfp4::Nvfp4KernelConfig;
use crate::cast::nvfp4::blocks::{encode_word8, nan_free_amax};
use crate::cast::scale::{nvfp4_block_scale, nvfp4_element_scale, nvfp4_global_encode_scale};
use crate::cast::swizzle::scale_index;
use crate::util::elements::load_chunk;

/// Elements per unit of `nvfp4_rowwise_kernel`: two 1x16 blocks, whose 32 codes are one 16-byte
/// store.
pub const NV_ROWWISE_ELEMENTS: usize = 32;

/// Units per cube of `nvfp4_rowwise_kernel`.
pub(crate) const NV_ROWWISE_UNITS: usize = 256;

/// Rowwise-only NVFP4 with 1x16 blocks (not grouped; `cols % 32 == 0`): one unit per two blocks
/// of a row, amaxes in registers, no shared memory and no cube barrier. A warp reads 32
/// consecutive 64-byte pieces of a row (2 KiB of bf16) and writes 512 contiguous code bytes as
/// 16-byte vectors. Same codes and scales as `nvfp4_kernel`, which stages a 64x64 tile in shared
/// memory for every case; the launcher picks this kernel for the forward activation's cast.
/// The element work is what bounds NVFP4 (Nsight Compute: the ALU pipe, not DRAM), hence
/// `nan_free_amax` and `encode_e2m1_not_nan`.
#[cube(launch_unchecked)]
pub fn nvfp4_rowwise_kernel<N: Size>(
    input: &Array<Vector<u32, N>>,
    amax: &Array<u32>,
    keys: &Array<u32>,
    codes: &mut Array<Vector<u32, N>>,
    scales: &mut Array<u8>,
    rows: usize,
    cols: usize,
    flags: u32,
    #[comptime] config: Nvfp4KernelConfig,
) {
    let pieces_per_row = cols / NV_ROWWISE_ELEMENTS;
    let piece = ABSOLUTE_POS;
    if piece < rows * pieces_per_row {
        let row = piece / pieces_per_row;
        let col0 = (piece % pieces_per_row) * NV_ROWWISE_ELEMENTS;
        let start = row * cols + col0;
        let swizzled = (flags & SWIZZLED) != 0u32;
        let mut v = Array::<f32>::new(32usize);
        #[unroll]
        for i in 0..4usize {
            load_chunk::<N>(input, start + i * 8, &mut v, i * 8, config.kind);
        }
        let s_enc = nvfp4_global_encode_scale(f32::reinterpret(amax[0]));
        let s_dec = 1.0f32 / s_enc;
        let multiplier = s_enc * 0.16666667f32; // S_enc * (1/6)
        let row_scale_cols = (cols / 16 + 3) / 4 * 4;
        let mut packed = Vector::<u32, N>::empty();
        #[unroll]
        for b in 0..2usize {
            let m = nan_free_amax(&mut v, comptime![b * 16], 16usize);
            let byte = nvfp4_block_scale(f32::reinterpret(m), multiplier);
            scales[scale_index(row, col0 / 16 + b, row_scale_cols, swizzled)] = u8::cast_from(byte);
            let enc = nvfp4_element_scale(byte, s_dec);
            #[unroll]
            for h in 0..2usize {
                packed[b * 2 + h] = encode_word8(
                    &v,
                    comptime![b * 16 + h * 8],
                    enc,
                    config.stochastic,
                    keys[0],
                    u32::cast_from(start + comptime![b * 16 + h * 8]),
                    true,
                );
            }
        }
        codes[start / NV_ROWWISE_ELEMENTS] = packed;
    }
}
