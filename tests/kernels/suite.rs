//! The kernel test suite, written once and instantiated per backend by `kernel_suite!`: the
//! macro and the helpers every part shares (format configurations, shapes and inputs, bit-equal
//! comparison, delayed-scaling state, grouped inputs). The checks themselves are in `cast`,
//! `delayed_scaling` and `grouped`.
#![allow(dead_code)]

use burn_lowp::backend::{LowpBackend, RowGroup, ScaleColumns};
use burn_lowp::format::fp8_block::BlockShape;
use burn_lowp::format::grouped::group_layout;
use burn_lowp::format::{
    FormatConfig, Fp8BlockScaling, Fp8CurrentScaling, Fp8Format, HostMatrix, HostQuantized,
    InputDtype, Mxfp8Config, Nvfp4Config, QuantizedData, Scales,
};

use crate::common::SplitMix;

/// Every format configuration the kernels implement.
pub fn configs() -> Vec<(&'static str, FormatConfig)> {
    let current = |fp8, pow2| {
        FormatConfig::Fp8Current(Fp8CurrentScaling {
            pow2_scales: pow2,
            ..Fp8CurrentScaling::new(fp8)
        })
    };
    let block = |shape| FormatConfig::Fp8Block(Fp8BlockScaling::new(Fp8Format::E4M3, shape));
    let mx = |fp8, block_2d| FormatConfig::Mxfp8(Mxfp8Config { fp8, block_2d });
    let nv = |block_2d, rht, seed| {
        FormatConfig::Nvfp4(Nvfp4Config {
            block_2d,
            rht,
            stochastic_seed: seed,
        })
    };
    vec![
        ("fp8-e4m3", current(Fp8Format::E4M3, false)),
        ("fp8-e4m3-pow2", current(Fp8Format::E4M3, true)),
        ("fp8-e5m2", current(Fp8Format::E5M2, false)),
        ("fp8-block-1x128", block(BlockShape::OneByOneTwentyEight)),
        ("fp8-block-128x128", block(BlockShape::OneTwentyEightSquare)),
        (
            "fp8-block-1x128-fp32-scales",
            FormatConfig::Fp8Block(Fp8BlockScaling {
                pow2_scales: false,
                ..Fp8BlockScaling::new(Fp8Format::E4M3, BlockShape::OneByOneTwentyEight)
            }),
        ),
        ("mxfp8-e4m3", mx(Fp8Format::E4M3, false)),
        ("mxfp8-e5m2", mx(Fp8Format::E5M2, false)),
        ("mxfp8-e4m3-2d", mx(Fp8Format::E4M3, true)),
        ("nvfp4", nv(false, false, None)),
        ("nvfp4-2d", nv(true, false, None)),
        ("nvfp4-rht", nv(false, true, None)),
        ("nvfp4-sr", nv(false, false, Some(1234))),
        ("nvfp4-rht-sr", nv(false, true, Some(99))),
    ]
}

/// Shapes for a config: non-square, several tiles, multiples of the block but not of 128 where
/// the format allows.
pub fn shapes(config: &FormatConfig) -> Vec<(usize, usize)> {
    match config {
        FormatConfig::Fp8Block(_) => vec![(128, 128), (256, 384), (384, 256)],
        FormatConfig::Mxfp8(_) => vec![(32, 32), (96, 160), (160, 288), (256, 512)],
        _ => vec![(16, 16), (48, 80), (96, 160), (160, 288), (256, 512)],
    }
}

/// A random matrix of `dtype` values: Gaussians with per-row scales over 2^-12..2^12, plus a
/// sprinkling of zeros, negative zeros, tiny (subnormal) values and exact block maxima ties.
pub fn input(rows: usize, cols: usize, dtype: InputDtype, seed: u64) -> HostMatrix {
    let mut rng = SplitMix(seed);
    let mut values = Vec::with_capacity(rows * cols);
    for _ in 0..rows {
        let row_scale = (24.0 * rng.uniform() - 12.0).exp2();
        for _ in 0..cols {
            let u = rng.uniform();
            let v = if u < 0.01 {
                0.0
            } else if u < 0.02 {
                -0.0
            } else if u < 0.03 {
                f32::from_bits(rng.next_u64() as u32 & 0x807F_FFFF) // f32 subnormal
            } else {
                (rng.normal() * row_scale) as f32
            };
            values.push(dtype.round(v));
        }
    }
    HostMatrix::new("input", rows, cols, dtype, values).unwrap()
}

/// Field-by-field bit comparison of two quantized results.
pub fn assert_bit_equal(ours: &HostQuantized, reference: &HostQuantized, context: &str) {
    assert_eq!(ours.format, reference.format, "{context}: format");
    assert_eq!(
        (ours.rows, ours.cols),
        (reference.rows, reference.cols),
        "{context}: shape"
    );
    for (dir, a, b) in [
        ("rowwise", &ours.rowwise, &reference.rowwise),
        ("columnwise", &ours.columnwise, &reference.columnwise),
    ] {
        match (a, b) {
            (None, None) => {}
            (Some(a), Some(b)) => assert_data_equal(a, b, &format!("{context} {dir}")),
            _ => panic!("{context}: {dir} present on one side only"),
        }
    }
}

fn assert_data_equal(a: &QuantizedData, b: &QuantizedData, context: &str) {
    assert_eq!(a.codes_shape, b.codes_shape, "{context}: codes shape");
    if a.codes != b.codes {
        let first = a
            .codes
            .iter()
            .zip(&b.codes)
            .position(|(x, y)| x != y)
            .unwrap();
        let count = a.codes.iter().zip(&b.codes).filter(|(x, y)| x != y).count();
        panic!("{context}: {count} code bytes differ, first at byte {first}: {:#04x} vs reference {:#04x}", a.codes[first], b.codes[first]);
    }
    assert_eq!(
        a.amax.map(f32::to_bits),
        b.amax.map(f32::to_bits),
        "{context}: amax {:?} vs {:?}",
        a.amax,
        b.amax
    );
    match (&a.scales, &b.scales) {
        (Scales::TensorScaleInv(x), Scales::TensorScaleInv(y)) => {
            assert_eq!(x.to_bits(), y.to_bits(), "{context}: scale_inv {x} vs {y}")
        }
        (
            Scales::BlockF32 {
                shape: sa,
                values: va,
            },
            Scales::BlockF32 {
                shape: sb,
                values: vb,
            },
        ) => {
            assert_eq!(sa, sb, "{context}: scale shape");
            let bits = |v: &Vec<f32>| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(va), bits(vb), "{context}: f32 block scales");
        }
        (
            Scales::BlockBytes {
                shape: sa,
                bytes: ba,
                layout: la,
            },
            Scales::BlockBytes {
                shape: sb,
                bytes: bb,
                layout: lb,
            },
        ) => {
            assert_eq!((sa, la), (sb, lb), "{context}: scale shape/layout");
            if ba != bb {
                let first = ba.iter().zip(bb).position(|(x, y)| x != y).unwrap();
                panic!(
                    "{context}: scale bytes differ, first at {first}: {:#04x} vs reference {:#04x}",
                    ba[first], bb[first]
                );
            }
        }
        (x, y) => panic!("{context}: scale kinds differ: {x:?} vs {y:?}"),
    }
}

/// Delayed-scaling scales as a module's state holds them: `scales[g]` at column `first + g *
/// stride` of a 1-D f32 tensor whose other columns hold a decoy (2^-24: smaller than any scale
/// the tests give, so a cast reading a wrong column, or a shared scale taken over one, is seen).
pub fn scale_state<B: LowpBackend>(scales: &[f32], first: usize, stride: usize, device: &B::Device) -> ScaleColumns<B> {
    let width = first + scales.len().saturating_sub(1) * stride + 2;
    let mut state = vec![2.0f32.powi(-24); width];
    for (g, &v) in scales.iter().enumerate() {
        state[first + g * stride] = v;
    }
    ScaleColumns { scales: f32_tensor::<B>(state, 1, width, device), first, stride }
}

/// An f32 `[rows, cols]` tensor of backend `B` from host values.
pub fn f32_tensor<B: LowpBackend>(values: Vec<f32>, rows: usize, cols: usize, device: &B::Device) -> burn::tensor::ops::FloatTensor<B> {
    B::bytes_float_from_host(&HostMatrix::new("f32", rows, cols, InputDtype::F32, values).unwrap(), device)
}

/// A grouped input laid out as the layout of `splits` says: packed random rows at their aligned
/// places, zero padding and tail.
pub fn grouped_input(splits: &[i32], tokens: usize, cols: usize, dtype: InputDtype, seed: u64) -> (HostMatrix, Vec<RowGroup>) {
    let layout = group_layout(splits, tokens);
    let packed = input(tokens, cols, dtype, seed);
    let mut values = vec![0.0f32; layout.rows * cols];
    for (row, &token) in layout.aligned_to_packed.iter().enumerate() {
        if (token as usize) < tokens {
            values[row * cols..(row + 1) * cols]
                .copy_from_slice(&packed.values[token as usize * cols..(token as usize + 1) * cols]);
        }
    }
    (HostMatrix::new("grouped input", layout.rows, cols, dtype, values).unwrap(), layout.groups)
}

/// Instantiates the suite for `$backend` on `$device` (an `Option`: `None` skips) with `$dtypes`.
macro_rules! kernel_suite {
    ($backend:ty, $device:expr, [$($dtype:expr),*]) => {
        fn dtypes() -> Vec<burn_lowp::format::InputDtype> { vec![$($dtype),*] }

        #[test]
        fn quantize_matches_reference() {
            if let Some(d) = $device { crate::cast::check_quantize_matches_reference::<$backend>(&d, &dtypes()); }
        }
        #[test]
        fn tile_quantize_kernels_match_reference() {
            if let Some(d) = $device { crate::cast::check_tile_quantize_kernels_match_reference::<$backend>(&d, &dtypes()); }
        }

        #[test]
        fn grouped_shared_scale_matches_per_slice() {
            if let Some(d) = $device { crate::grouped::check_grouped_shared_scale_matches_per_slice::<$backend>(&d, &dtypes()); }
        }

        #[test]
        fn swizzled_scales_match_reference() {
            if let Some(d) = $device { crate::cast::check_swizzled_scales_match_reference::<$backend>(&d, &dtypes()); }
        }

        #[test]
        fn dequantize_matches_reference() {
            if let Some(d) = $device { crate::cast::check_dequantize_matches_reference::<$backend>(&d, &dtypes()); }
        }

        #[test]
        fn amax_over_many_chunks_per_unit_matches_reference() {
            if let Some(d) = $device { crate::cast::check_amax_over_many_chunks_per_unit::<$backend>(&d, &dtypes()); }
        }

        #[test]
        fn delayed_scaling_matches_reference() {
            if let Some(d) = $device { crate::delayed_scaling::check_delayed_scaling_matches_reference::<$backend>(&d, &dtypes()); }
        }

        #[test]
        fn delayed_casts_record_into_history() {
            if let Some(d) = $device { crate::delayed_scaling::check_delayed_casts_record_into_history::<$backend>(&d, &dtypes()); }
        }

        #[test]
        fn dropped_group_layout_leaves_reads_working() {
            if let Some(d) = $device { crate::grouped::check_dropped_group_layout_leaves_reads_working::<$backend>(&d); }
        }

        #[test]
        fn delayed_update_matches_tensor_ops() {
            if let Some(d) = $device { crate::delayed_scaling::check_delayed_update_matches_tensor_ops::<$backend>(&d); }
        }

        #[test]
        fn nvfp4_special_values_match_reference() {
            if let Some(d) = $device { crate::cast::check_nvfp4_special_values_match_reference::<$backend>(&d, &dtypes()); }
        }

        #[test]
        fn fp8_special_values_match_reference() {
            if let Some(d) = $device { crate::cast::check_fp8_special_values_match_reference::<$backend>(&d, &dtypes()); }
        }

        #[test]
        fn golden_inputs_match_reference() {
            if let Some(d) = $device {
                crate::cast::check_goldens::<$backend>(&d, dtypes().contains(&burn_lowp::format::InputDtype::BF16));
            }
        }

        #[test]
        fn group_layout_matches_reference() {
            if let Some(d) = $device { crate::grouped::check_group_layout_matches_reference::<$backend>(&d); }
        }

        #[test]
        fn grouped_quantize_matches_per_slice_quantize() {
            if let Some(d) = $device { crate::grouped::check_grouped_quantize_matches_per_slice::<$backend>(&d, &dtypes()); }
        }

        #[test]
        fn padded_fp8_quantize_matches_pad_then_quantize() {
            if let Some(d) = $device { crate::grouped::check_padded_fp8_quantize_matches_pad_then_quantize::<$backend>(&d, &dtypes()); }
        }

        #[test]
        fn grouped_dbias_amax_matches_reference() {
            if let Some(d) = $device { crate::grouped::check_grouped_dbias_amax_matches_reference::<$backend>(&d, &dtypes()); }
        }

        #[test]
        fn gather_rows_matches_reference() {
            let dtypes: Vec<_> = dtypes().into_iter().filter(|d| *d != burn_lowp::format::InputDtype::BF16).collect();
            if let Some(d) = $device { crate::grouped::check_gather_rows_matches_reference::<$backend>(&d, &dtypes); }
        }

        #[test]
        fn group_epilogue_matches_reference() {
            let dtypes: Vec<_> = dtypes().into_iter().filter(|d| *d != burn_lowp::format::InputDtype::BF16).collect();
            if let Some(d) = $device { crate::grouped::check_group_epilogue_matches_reference::<$backend>(&d, &dtypes); }
        }

        #[test]
        fn bad_shapes_are_errors() {
            if let Some(d) = $device { crate::cast::check_bad_shapes_are_errors::<$backend>(&d); }
        }
    };
}
pub(crate) use kernel_suite;
