//! `burn_lowp_kernels::cast::gemm_block_scales`: compact FP8 block scales rewritten into the
//! layouts cuBLASLt reads (transposed for 1x128, rows padded to 4 columns with 1.0 for 128x128),
//! against the same rewrite done element by element on the host.

use burn_lowp_kernels::cubecl::prelude::*;
use burn_lowp_kernels::cast::gemm_block_scales::{gemm_block_scales, GemmBlockScales};

use crate::common::read_words;

pub fn check_gemm_block_scales<R: Runtime>(device: &R::Device) {
    let client = R::client(device);
    for (rows, cols) in [(1usize, 1usize), (5, 3), (3, 5), (130, 7), (64, 8), (2, 129)] {
        // Distinct f32 bit patterns per cell, so a misplaced word shows.
        let scales: Vec<u32> = (0..rows * cols).map(|i| (0.5f32 + i as f32 * 0.25).to_bits()).collect();
        let bytes: Vec<u8> = scales.iter().flat_map(|w| w.to_le_bytes()).collect();
        let input = client.create_from_slice(&bytes);

        let transposed = gemm_block_scales(&client, &input, rows, cols, GemmBlockScales::Transposed);
        let mut expected = vec![0u32; rows * cols];
        for r in 0..rows {
            for c in 0..cols {
                expected[c * rows + r] = scales[r * cols + c];
            }
        }
        assert_eq!(read_words(&client, &transposed, rows * cols), expected, "transposed [{rows}, {cols}]");

        let padded_cols = cols.div_ceil(4) * 4;
        let padded = gemm_block_scales(&client, &input, rows, cols, GemmBlockScales::PaddedRows);
        let mut expected = vec![1.0f32.to_bits(); rows * padded_cols];
        for r in 0..rows {
            expected[r * padded_cols..r * padded_cols + cols].copy_from_slice(&scales[r * cols..(r + 1) * cols]);
        }
        assert_eq!(read_words(&client, &padded, rows * padded_cols), expected, "padded rows [{rows}, {cols}]");
    }
}

macro_rules! gemm_block_scales_suite {
    ($runtime:ty, $device:expr) => {
        #[test]
        fn gemm_block_scales_match_host_rewrite() {
            if let Some(d) = $device {
                crate::gemm_block_scales::check_gemm_block_scales::<$runtime>(&d);
            }
        }
    };
}
pub(crate) use gemm_block_scales_suite;
