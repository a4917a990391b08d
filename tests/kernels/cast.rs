//! The quantize and dequantize kernels of every format against the host reference, bit for bit:
//! random inputs of every shape and dtype (tile kernels forced too), swizzled scales, amaxes over
//! many chunks, special values (zeros, subnormals, rounding thresholds, NaN, infinities), the
//! golden inputs, and shapes a format cannot take.
#![allow(dead_code)]

use burn_lowp::backend::{LowpBackend, ScaleColumns};
use burn_lowp::format::{
    quantize, quantize_fp8_with_scale, Direction, FormatConfig, Fp8CurrentScaling, Fp8Format,
    HostMatrix, InputDtype, Mxfp8Config, Nvfp4Config, Usage,
};

use crate::common::SplitMix;
use crate::suite::*;

pub fn check_quantize_matches_reference<B: LowpBackend>(device: &B::Device, dtypes: &[InputDtype]) {
    let cases = quantize_cases_match_reference::<B>(device, dtypes, |_| true);
    println!("{cases} quantize cases bit-exact");
}

/// FP8 current scaling of a tensor large enough that the amax pass's grid-stride loop gives each
/// unit several chunks (the other tests' tensors give a unit one at most): with its single
/// largest value placed at spread-out positions, the codes and scale equal the reference's bit
/// for bit, so that value was folded wherever it sat.
pub fn check_amax_over_many_chunks_per_unit<B: LowpBackend>(device: &B::Device, dtypes: &[InputDtype]) {
    // 4.7 M elements: 18 chunks of 8 a unit on a grid of 128 cubes of 256 (lavapipe), two to
    // three on an H100's 1056 cubes.
    let (rows, cols) = (4608, 1024);
    let config = FormatConfig::Fp8Current(Fp8CurrentScaling::new(Fp8Format::E4M3));
    let n = rows * cols;
    let mut cases = 0;
    for &dtype in dtypes.iter().filter(|d| matches!(d, InputDtype::BF16 | InputDtype::F32)) {
        let mut rng = SplitMix(0xA3A3 + dtype.name().len() as u64);
        let base: Vec<f32> = (0..n).map(|_| dtype.round((2.0 * rng.uniform() - 1.0) as f32)).collect();
        for (i, at) in [0, n - 1, n / 2 + 5, 3 * n / 7 + 1, 5 * n / 6 + 9, n / 9 + 3].into_iter().enumerate() {
            let mut values = base.clone();
            values[at] = if i % 2 == 0 { 3.5 } else { -3.5 };
            let x = HostMatrix::new("input", rows, cols, dtype, values).unwrap();
            let context = format!("fp8 current {} [{rows}, {cols}], largest at {at}", dtype.name());
            let reference = quantize(&x, &config, Usage::ROWWISE).unwrap();
            let ours = B::quantize_tensor(B::bytes_float_from_host(&x, device), &config, Usage::ROWWISE, false)
                .unwrap_or_else(|e| panic!("{context}: {e}"));
            assert_bit_equal(&ours.to_host().unwrap(), &reference, &context);
            cases += 1;
        }
    }
    assert!(cases > 0);
    println!("{cases} large current-scaling casts bit-exact");
}

/// The launcher takes `mxfp8_strip_kernel` / `fp8_block_transposed_kernel` /
/// `nvfp4_strip_kernel` for columnwise 16-bit cases (and `nvfp4_rowwise_kernel` for NVFP4's 1D
/// rowwise casts) and keeps the tile kernels for the rest; forced on this test's thread, the tile
/// kernels must give the reference's bytes for every MXFP8, FP8 block and NVFP4 case too.
pub fn check_tile_quantize_kernels_match_reference<B: LowpBackend>(
    device: &B::Device,
    dtypes: &[InputDtype],
) {
    burn_lowp_kernels::cast::kernel_choice::force_tile_quantize_kernels(true);
    let cases = quantize_cases_match_reference::<B>(device, dtypes, |config| {
        matches!(
            config,
            FormatConfig::Mxfp8(_) | FormatConfig::Fp8Block(_) | FormatConfig::Nvfp4(_)
        )
    });
    burn_lowp_kernels::cast::kernel_choice::force_tile_quantize_kernels(false);
    assert!(cases > 0);
    println!("{cases} quantize cases bit-exact on the tile kernels");
}

/// Every config `keep` accepts, every shape and direction, bit-exact against the reference.
fn quantize_cases_match_reference<B: LowpBackend>(
    device: &B::Device,
    dtypes: &[InputDtype],
    keep: impl Fn(&FormatConfig) -> bool,
) -> usize {
    let mut cases = 0;
    for &dtype in dtypes {
        for (name, config) in configs().into_iter().filter(|(_, c)| keep(c)) {
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
                        B::quantize_tensor(B::bytes_float_from_host(&x, device), &config, usage, false)
                            .unwrap_or_else(|e| panic!("{context}: {e}"));
                    assert_bit_equal(&ours.to_host().unwrap(), &reference, &context);
                    cases += 1;
                }
            }
        }
    }
    cases
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
                    B::quantize_tensor(B::bytes_float_from_host(&x, device), &config, Usage::BOTH, true)
                        .unwrap();
                // ... the standalone kernels swizzle compact ones and undo it.
                let compact =
                    B::quantize_tensor(B::bytes_float_from_host(&x, device), &config, Usage::BOTH, false)
                        .unwrap();
                let swizzled = B::quantize_swizzle_scales(compact).unwrap();
                let unswizzled = B::quantize_unswizzle_scales(swizzled.clone()).unwrap();
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
                // Rowwise only (MXFP8 1D has a kernel of its own for it), swizzled in-kernel.
                let mut reference = quantize(&x, &config, Usage::ROWWISE).unwrap();
                reference.swizzle_scales().unwrap();
                let direct =
                    B::quantize_tensor(B::bytes_float_from_host(&x, device), &config, Usage::ROWWISE, true)
                        .unwrap();
                assert_bit_equal(
                    &direct.to_host().unwrap(),
                    &reference,
                    &format!("{context}: rowwise in-kernel"),
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
            let q = B::quantize_tensor(B::bytes_float_from_host(&x, device), &config, Usage::BOTH, false)
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
                    crate::common::read_f32::<B>(B::quantize_dequantize(&q, direction).unwrap())
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

/// NVFP4 at its rounding boundaries and on special values, bit-exact against the reference for
/// every NVFP4 config and direction. One element is 2688 (so the global encode scale is 1) and
/// every 1x16 row block and 16x1 column block holds a 6.0 (so its E4M3 scale is 1 and its
/// elements are encoded as they are): the other elements are each E2M1 rounding threshold (0.25,
/// 0.75, 1.25, 1.75, 2.5, 3.5, 5, both signs) and its neighbours a float, f16 and bf16 step
/// away, zeros, subnormals, values past 6, and NaNs (the amax skips them, they encode to 0; in
/// the RHT'd copies they spread over their block). A second matrix adds infinities (the global
/// amax is then infinite).
pub fn check_nvfp4_special_values_match_reference<B: LowpBackend>(device: &B::Device, dtypes: &[InputDtype]) {
    let mut specials = vec![0.0f32, -0.0, f32::from_bits(1), -f32::from_bits(0x007F_FFFF), 6.0, -6.0, 6.5, 7.0, -100.0, f32::NAN];
    for t in [0.25f32, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0] {
        for step in [0.0f32, 2.0f32.powi(-23), 2.0f32.powi(-10), 2.0f32.powi(-7)] {
            for sign in [1.0f32, -1.0] {
                specials.push(sign * t * (1.0 + step));
                specials.push(sign * t * (1.0 - step));
            }
        }
    }
    let (rows, cols) = (64, 128);
    let mut cases = 0;
    for &dtype in dtypes {
        for with_inf in [false, true] {
            let values = (0..rows * cols)
                .map(|i| {
                    let (r, c) = (i / cols, i % cols);
                    let v = if r == 0 && c == 0 {
                        2688.0
                    } else if with_inf && i % 97 == 5 {
                        if i % 2 == 0 { f32::INFINITY } else { f32::NEG_INFINITY }
                    } else if r % 16 == 0 || c % 16 == 0 {
                        6.0
                    } else {
                        specials[(i * 7) % specials.len()]
                    };
                    dtype.round(v)
                })
                .collect();
            let x = HostMatrix::new("nvfp4 special", rows, cols, dtype, values).unwrap();
            for (name, config) in configs().into_iter().filter(|(_, c)| matches!(c, FormatConfig::Nvfp4(_))) {
                for usage in [Usage::BOTH, Usage::ROWWISE, Usage::COLUMNWISE] {
                    let context = format!("special values {name} {} inf {with_inf} {usage:?}", dtype.name());
                    let reference = quantize(&x, &config, usage).unwrap();
                    let ours = B::quantize_tensor(B::bytes_float_from_host(&x, device), &config, usage, false)
                        .unwrap_or_else(|e| panic!("{context}: {e}"));
                    assert_bit_equal(&ours.to_host().unwrap(), &reference, &context);
                    cases += 1;
                }
            }
        }
    }
    println!("{cases} NVFP4 special-value cases bit-exact");
}

/// NaN of either sign, infinities, values past the format's maximum, halfway cases at the top and
/// bottom of the range and f32 subnormals, cast with a known scale (delayed scaling's cast): the
/// special cases where the integer encoder and the CUDA conversion instruction could part ways.
pub fn check_fp8_special_values_match_reference<B: LowpBackend>(device: &B::Device, dtypes: &[InputDtype]) {
    let specials = [
        f32::NAN,
        -f32::NAN,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::MAX,
        -f32::MAX,
        448.0,
        464.0, // E4M3: halfway between 448 and the NaN code
        -465.0,
        57344.0,
        61440.0, // E5M2: halfway between 57344 and infinity
        -1.0e6,
        2.0f32.powi(-10), // E4M3: halfway between 0 and the smallest subnormal
        3.0 * 2.0f32.powi(-10),
        -2.0f32.powi(-17), // E5M2: halfway between 0 and the smallest subnormal
        2.0f32.powi(-6) - 2.0f32.powi(-12),
        f32::from_bits(1),
        -f32::from_bits(0x007F_FFFF),
        0.0,
        -0.0,
    ];
    let (rows, cols) = (32, 256);
    let mut rng = SplitMix(0xF8);
    let mut cases = 0;
    for &dtype in dtypes {
        let values = (0..rows * cols)
            .map(|i| {
                let v = if i % 3 == 0 { specials[(i / 3) % specials.len()] } else { rng.normal() as f32 * 300.0 };
                dtype.round(v)
            })
            .collect();
        let x = HostMatrix::new("special", rows, cols, dtype, values).unwrap();
        for fp8 in [Fp8Format::E4M3, Fp8Format::E5M2] {
            for scale in [1.0f32, 0.5, 4.0] {
                let context = format!("special values {fp8:?} scale {scale} {}", dtype.name());
                let reference = quantize_fp8_with_scale(&x, fp8, scale, Usage::BOTH).unwrap();
                let scale_tensor = B::bytes_float_from_host(
                    &HostMatrix::new("scale", 1, 1, InputDtype::F32, vec![scale]).unwrap(),
                    device,
                );
                let ours = B::quantize_fp8_with_scale(B::bytes_float_from_host(&x, device), fp8, ScaleColumns::whole(scale_tensor), Usage::BOTH, None)
                    .unwrap_or_else(|e| panic!("{context}: {e}"));
                assert_bit_equal(&ours.to_host().unwrap(), &reference, &context);
                cases += 1;
            }
        }
    }
    println!("{cases} special-value FP8 casts bit-exact");
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
            B::quantize_tensor(B::bytes_float_from_host(&x, device), &config, Usage::BOTH, false).unwrap();
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
        let err = B::quantize_tensor(B::bytes_float_from_host(&x, device), &config, Usage::BOTH, false)
            .unwrap_err()
            .to_string();
        assert!(err.contains(expect), "{err}");
    }
}
