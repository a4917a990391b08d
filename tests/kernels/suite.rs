//! The kernel test suite, written once and instantiated per backend by `kernel_suite!`.
#![allow(dead_code)]

use burn_lowp::backend::LowpBackend;
use burn_lowp::format::fp8_block::BlockShape;
use burn_lowp::format::{
    quantize, quantize_fp8_with_scale, Direction, FormatConfig, Fp8BlockScaling, Fp8CurrentScaling,
    Fp8Format, HostMatrix, HostQuantized, InputDtype, Mxfp8Config, Nvfp4Config, QuantizedData,
    Scales, Usage,
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

pub fn check_quantize_matches_reference<B: LowpBackend>(device: &B::Device, dtypes: &[InputDtype]) {
    let mut cases = 0;
    for &dtype in dtypes {
        for (name, config) in configs() {
            for (rows, cols) in shapes(&config) {
                let x = input(
                    rows,
                    cols,
                    dtype,
                    (rows * 7919 + cols) as u64 ^ name.len() as u64,
                );
                for usage in [Usage::BOTH, Usage::ROWWISE, Usage::COLUMNWISE] {
                    let context = format!("{name} {} [{rows}, {cols}] {usage:?}", dtype.name());
                    let reference = quantize(&x, &config, usage).unwrap();
                    let ours =
                        B::lowp_quantize(B::float_from_host(&x, device), &config, usage, false)
                            .unwrap_or_else(|e| panic!("{context}: {e}"));
                    assert_bit_equal(&ours.to_host().unwrap(), &reference, &context);
                    cases += 1;
                }
            }
        }
    }
    println!("{cases} quantize cases bit-exact");
}

pub fn check_swizzled_scales_match_reference<B: LowpBackend>(
    device: &B::Device,
    dtypes: &[InputDtype],
) {
    for &dtype in dtypes {
        for (name, config) in configs() {
            if !matches!(config, FormatConfig::Mxfp8(_) | FormatConfig::Nvfp4(_)) {
                continue;
            }
            for (rows, cols) in shapes(&config) {
                let context = format!("{name} {} [{rows}, {cols}] swizzled", dtype.name());
                let x = input(rows, cols, dtype, 5 + rows as u64);
                let mut reference = quantize(&x, &config, Usage::BOTH).unwrap();
                // optimize_for_gemm writes swizzled scales from the kernel ...
                let direct =
                    B::lowp_quantize(B::float_from_host(&x, device), &config, Usage::BOTH, true)
                        .unwrap();
                // ... the standalone kernels swizzle compact ones and undo it.
                let compact =
                    B::lowp_quantize(B::float_from_host(&x, device), &config, Usage::BOTH, false)
                        .unwrap();
                let swizzled = B::swizzle_scales(compact).unwrap();
                let unswizzled = B::unswizzle_scales(swizzled.clone()).unwrap();
                assert_bit_equal(
                    &unswizzled.to_host().unwrap(),
                    &reference,
                    &format!("{context}: unswizzle"),
                );
                reference.swizzle_scales().unwrap();
                assert_bit_equal(
                    &direct.to_host().unwrap(),
                    &reference,
                    &format!("{context}: in-kernel"),
                );
                assert_bit_equal(
                    &swizzled.to_host().unwrap(),
                    &reference,
                    &format!("{context}: standalone"),
                );
            }
        }
    }
}

pub fn check_dequantize_matches_reference<B: LowpBackend>(
    device: &B::Device,
    dtypes: &[InputDtype],
) {
    for &dtype in dtypes {
        for (name, config) in configs() {
            let (rows, cols) = shapes(&config)[1];
            let x = input(rows, cols, dtype, 77);
            let reference = quantize(&x, &config, Usage::BOTH).unwrap();
            let q = B::lowp_quantize(B::float_from_host(&x, device), &config, Usage::BOTH, false)
                .unwrap();
            for direction in [Direction::Rowwise, Direction::Columnwise] {
                let context = format!("{name} {} {direction:?} dequantize", dtype.name());
                let expected: Vec<u32> = reference
                    .dequantize(direction)
                    .unwrap()
                    .iter()
                    .map(|v| v.to_bits())
                    .collect();
                let got: Vec<u32> =
                    crate::common::read_f32::<B>(B::lowp_dequantize(&q, direction).unwrap())
                        .iter()
                        .map(|v| v.to_bits())
                        .collect();
                assert_eq!(got.len(), expected.len(), "{context}");
                let bad = got.iter().zip(&expected).filter(|(a, b)| a != b).count();
                assert_eq!(bad, 0, "{context}: {bad} values differ");
            }
        }
    }
}

pub fn check_delayed_scaling_matches_reference<B: LowpBackend>(
    device: &B::Device,
    dtypes: &[InputDtype],
) {
    for &dtype in dtypes {
        for fp8 in [Fp8Format::E4M3, Fp8Format::E5M2] {
            for scale in [1.0f32, 0.37, 3.0e3, 2.0f32.powi(-20)] {
                let x = input(96, 160, dtype, scale.to_bits() as u64);
                let context = format!("delayed {fp8:?} scale {scale} {}", dtype.name());
                let reference = quantize_fp8_with_scale(&x, fp8, scale, Usage::BOTH).unwrap();
                let scale_tensor = B::float_from_host(
                    &HostMatrix::new("scale", 1, 1, InputDtype::F32, vec![scale]).unwrap(),
                    device,
                );
                let ours = B::quantize_fp8_with_scale(
                    B::float_from_host(&x, device),
                    fp8,
                    scale_tensor,
                    Usage::BOTH,
                )
                .unwrap();
                assert_bit_equal(&ours.to_host().unwrap(), &reference, &context);
            }
        }
    }
}

pub fn check_goldens<B: LowpBackend>(device: &B::Device, native_bf16: bool) {
    let g = crate::common::goldens();
    let mut checked = 0;
    for case in &g.cases {
        let p = &case["params"];
        let config = match case["kind"].as_str().unwrap() {
            "fp8_current_scaling" => FormatConfig::Fp8Current(Fp8CurrentScaling {
                pow2_scales: p["pow2_scales"].as_bool().unwrap(),
                ..Fp8CurrentScaling::new(if p["fp8"] == "e4m3" {
                    Fp8Format::E4M3
                } else {
                    Fp8Format::E5M2
                })
            }),
            "mxfp8" => FormatConfig::Mxfp8(Mxfp8Config {
                fp8: if p["fp8"] == "e4m3" {
                    Fp8Format::E4M3
                } else {
                    Fp8Format::E5M2
                },
                block_2d: false,
            }),
            "nvfp4" => FormatConfig::Nvfp4(Nvfp4Config {
                block_2d: p["tile"][0].as_u64() == Some(16),
                rht: p["rht_columnwise"].as_bool().unwrap(),
                stochastic_seed: None,
            }),
            _ => continue,
        };
        let mut x = g.file.read_matrix(p["input"].as_str().unwrap()).unwrap();
        if !native_bf16 {
            x.dtype = InputDtype::F32; // the backend holds f32 only; the values are the same
        }
        let reference = quantize(&x, &config, Usage::BOTH).unwrap();
        let ours =
            B::lowp_quantize(B::float_from_host(&x, device), &config, Usage::BOTH, false).unwrap();
        assert_bit_equal(
            &ours.to_host().unwrap(),
            &reference,
            case["name"].as_str().unwrap(),
        );
        checked += 1;
    }
    println!("{checked} golden inputs bit-exact against the reference");
}

pub fn check_bad_shapes_are_errors<B: LowpBackend>(device: &B::Device) {
    let cases: Vec<(FormatConfig, usize, usize, &str)> = vec![
        (configs()[0].1, 20, 32, "M = 20"),
        (configs()[3].1, 128, 192, "K = 192"),
        (configs()[6].1, 64, 48, "K = 48"),
        (configs()[9].1, 24, 32, "M = 24"),
        (
            FormatConfig::Nvfp4(Nvfp4Config {
                block_2d: true,
                rht: true,
                stochastic_seed: None,
            }),
            32,
            32,
            "RHT",
        ),
    ];
    for (config, rows, cols, expect) in cases {
        let x = input(rows, cols, InputDtype::F32, 1);
        let err = B::lowp_quantize(B::float_from_host(&x, device), &config, Usage::BOTH, false)
            .unwrap_err()
            .to_string();
        assert!(err.contains(expect), "{err}");
    }
}

/// Instantiates the suite for `$backend` on `$device` (an `Option`: `None` skips) with `$dtypes`.
macro_rules! kernel_suite {
    ($backend:ty, $device:expr, [$($dtype:expr),*]) => {
        fn dtypes() -> Vec<burn_lowp::format::InputDtype> { vec![$($dtype),*] }

        #[test]
        fn quantize_matches_reference() {
            if let Some(d) = $device { crate::suite::check_quantize_matches_reference::<$backend>(&d, &dtypes()); }
        }

        #[test]
        fn swizzled_scales_match_reference() {
            if let Some(d) = $device { crate::suite::check_swizzled_scales_match_reference::<$backend>(&d, &dtypes()); }
        }

        #[test]
        fn dequantize_matches_reference() {
            if let Some(d) = $device { crate::suite::check_dequantize_matches_reference::<$backend>(&d, &dtypes()); }
        }

        #[test]
        fn delayed_scaling_matches_reference() {
            if let Some(d) = $device { crate::suite::check_delayed_scaling_matches_reference::<$backend>(&d, &dtypes()); }
        }

        #[test]
        fn golden_inputs_match_reference() {
            if let Some(d) = $device {
                crate::suite::check_goldens::<$backend>(&d, dtypes().contains(&burn_lowp::format::InputDtype::BF16));
            }
        }

        #[test]
        fn bad_shapes_are_errors() {
            if let Some(d) = $device { crate::suite::check_bad_shapes_are_errors::<$backend>(&d); }
        }
    };
}
pub(crate) use kernel_suite;
