//! Properties of the reference quantizers on random shapes and values: error bounds from each
//! format's definition, agreement between directions and between formats, layout round trips.

use burn_lowp::format::codec::{e8m0_to_f32, Fp8Format};
use burn_lowp::format::matrix::transpose;
use burn_lowp::format::{
    quantize_fp8_block, quantize_fp8_current, quantize_mxfp8, quantize_nvfp4, swizzle, BlockShape,
    Direction, Fp8BlockScaling, Fp8CurrentScaling, HostMatrix, InputDtype, Mxfp8Config,
    Nvfp4Config, Scales, Usage,
};
use proptest::prelude::*;

use crate::common::random_matrix;

fn mantissa_bits(fmt: Fp8Format) -> i32 {
    match fmt {
        Fp8Format::E4M3 => 3,
        Fp8Format::E5M2 => 2,
    }
}

fn min_normal_exponent(fmt: Fp8Format) -> i32 {
    match fmt {
        Fp8Format::E4M3 => -6,
        Fp8Format::E5M2 => -14,
    }
}

/// Round-to-nearest bound for one element quantized with multiplier `1/scale_inv`: half an ulp
/// relative to |x|, or half the subnormal quantum, with slack for the f32 product.
fn within_fp8_rounding(x: f32, dq: f32, scale_inv: f32, fmt: Fp8Format) -> bool {
    let m = mantissa_bits(fmt);
    let half_quantum = ((min_normal_exponent(fmt) - m - 1) as f64).exp2() * scale_inv as f64;
    let bound = (x.abs() as f64 * (-(m + 1) as f64).exp2() + half_quantum) * (1.0 + 1e-6);
    (x as f64 - dq as f64).abs() <= bound
}

fn unpack_e2m1(bytes: &[u8]) -> Vec<u8> {
    bytes.iter().flat_map(|b| [b & 0xF, b >> 4]).collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn fp8_current_scaling_error_is_half_an_ulp(
        rows in 1usize..40, cols in 1usize..70, seed in any::<u64>(), spread in 0.0f64..12.0,
        e5m2 in any::<bool>(), pow2 in any::<bool>(),
    ) {
        let x = random_matrix(rows, cols, seed, spread);
        let fmt = if e5m2 { Fp8Format::E5M2 } else { Fp8Format::E4M3 };
        let config = Fp8CurrentScaling { pow2_scales: pow2, ..Fp8CurrentScaling::new(fmt) };
        let q = quantize_fp8_current(&x, &config, Usage::BOTH).unwrap();
        let Scales::TensorScaleInv(scale_inv) = q.rowwise.as_ref().unwrap().scales else { panic!() };
        if pow2 {
            prop_assert_eq!(scale_inv.to_bits() & 0x7F_FFFF, 0, "pow2 scale_inv {}", scale_inv);
        }
        let row = q.dequantize(Direction::Rowwise).unwrap();
        prop_assert_eq!(&row, &q.dequantize(Direction::Columnwise).unwrap());
        for (&v, &d) in x.values.iter().zip(&row) {
            prop_assert!(within_fp8_rounding(v, d, scale_inv, fmt), "x={v:e} dq={d:e} scale_inv={scale_inv:e}");
        }
    }

    #[test]
    fn fp8_block_error_bound_and_1x128_equals_per_tensor_per_block(
        mb in 1usize..3, kb in 1usize..3, seed in any::<u64>(), spread in 0.0f64..16.0,
        square in any::<bool>(),
    ) {
        let x = random_matrix(128 * mb, 128 * kb, seed, spread);
        let block = if square { BlockShape::OneTwentyEightSquare } else { BlockShape::OneByOneTwentyEight };
        let config = Fp8BlockScaling::new(Fp8Format::E4M3, block);
        let q = quantize_fp8_block(&x, &config, Usage::BOTH).unwrap();
        let row = q.rowwise.as_ref().unwrap();
        let Scales::BlockF32 { shape, values } = &row.scales else { panic!() };
        let block_rows = if square { 128 } else { 1 };
        let dq = q.dequantize(Direction::Rowwise).unwrap();
        for r in 0..x.rows {
            for c in 0..x.cols {
                let s = values[(r / block_rows) * shape[1] + c / 128];
                prop_assert_eq!(s.to_bits() & 0x7F_FFFF, 0, "pow2 scale_inv");
                prop_assert!(within_fp8_rounding(x.at(r, c), dq[r * x.cols + c], s, Fp8Format::E4M3));
            }
        }
        let col = q.columnwise.as_ref().unwrap();
        if square {
            // One scale per tile: the columnwise codes are the transposed rowwise codes.
            prop_assert_eq!(&col.codes, &transpose(&row.codes, x.rows, x.cols));
        } else {
            // Each 1x128 block is a tiny tensor quantized with pow2 current scaling.
            for r in 0..x.rows {
                for b in 0..kb {
                    let part = HostMatrix::new("block", 1, 128, InputDtype::BF16,
                        x.values[r * x.cols + b * 128..r * x.cols + b * 128 + 128].to_vec()).unwrap();
                    let cs = Fp8CurrentScaling { pow2_scales: true, ..Fp8CurrentScaling::new(Fp8Format::E4M3) };
                    let single = quantize_fp8_current(&part, &cs, Usage::ROWWISE).unwrap();
                    prop_assert_eq!(&single.rowwise.unwrap().codes[..],
                        &row.codes[r * x.cols + b * 128..r * x.cols + b * 128 + 128]);
                }
            }
            // Columnwise: blocks of 128 along M, scales [K, M/128].
            let Scales::BlockF32 { shape: cshape, values: cvalues } = &col.scales else { panic!() };
            let dq_col = q.dequantize(Direction::Columnwise).unwrap();
            for r in 0..x.rows {
                for c in 0..x.cols {
                    let s = cvalues[c * cshape[1] + r / 128];
                    prop_assert!(within_fp8_rounding(x.at(r, c), dq_col[r * x.cols + c], s, Fp8Format::E4M3));
                }
            }
        }
    }

    #[test]
    fn mxfp8_scales_are_the_smallest_that_fit(
        mb in 1usize..5, kb in 1usize..6, seed in any::<u64>(), spread in 0.0f64..30.0,
        e5m2 in any::<bool>(),
    ) {
        let x = random_matrix(32 * mb, 32 * kb, seed, spread);
        let fmt = if e5m2 { Fp8Format::E5M2 } else { Fp8Format::E4M3 };
        let q = quantize_mxfp8(&x, &Mxfp8Config { fp8: fmt, block_2d: false }, Usage::BOTH).unwrap();
        let row = q.rowwise.as_ref().unwrap();
        let Scales::BlockBytes { shape, bytes, .. } = &row.scales else { panic!() };
        let dq = q.dequantize(Direction::Rowwise).unwrap();
        for r in 0..x.rows {
            for b in 0..kb {
                let e = bytes[r * shape[1] + b];
                let block = &x.values[r * x.cols + b * 32..r * x.cols + b * 32 + 32];
                let amax = block.iter().fold(0.0f32, |a, v| a.max(v.abs())) as f64;
                // Nothing overflows, and one scale step smaller would overflow.
                // (1e-6 slack: TE scales `amax * (1/fp8_max)`, one f32 rounding away from the quotient.)
                prop_assert!(amax <= fmt.max() as f64 * e8m0_to_f32(e) as f64 * (1.0 + 1e-6));
                if e > 1 {
                    prop_assert!(amax > fmt.max() as f64 * e8m0_to_f32(e - 1) as f64 * (1.0 - 1e-6));
                }
                for i in 0..32 {
                    let idx = r * x.cols + b * 32 + i;
                    prop_assert!(within_fp8_rounding(x.values[idx], dq[idx], e8m0_to_f32(e), fmt));
                }
            }
        }
        // Columnwise blocks are rowwise blocks of the transpose.
        let xt = x.transpose();
        let qt = quantize_mxfp8(&xt, &Mxfp8Config { fp8: fmt, block_2d: false }, Usage::ROWWISE).unwrap();
        let col = q.columnwise.as_ref().unwrap();
        prop_assert_eq!(&transpose(&col.codes, x.rows, x.cols), &qt.rowwise.as_ref().unwrap().codes);
        let Scales::BlockBytes { shape: cs, bytes: cb, .. } = &col.scales else { panic!() };
        let Scales::BlockBytes { shape: ts, bytes: tb, .. } = &qt.rowwise.as_ref().unwrap().scales else { panic!() };
        for mblock in 0..mb {
            for c in 0..x.cols {
                prop_assert_eq!(cb[mblock * cs[1] + c], tb[c * ts[1] + mblock]);
            }
        }
    }

    #[test]
    fn two_d_blocks_make_both_directions_agree(
        t_rows in 1usize..4, t_cols in 1usize..4, seed in any::<u64>(), spread in 0.0f64..10.0,
    ) {
        let x = random_matrix(32 * t_rows, 32 * t_cols, seed, spread);
        let mx = quantize_mxfp8(&x, &Mxfp8Config { fp8: Fp8Format::E4M3, block_2d: true }, Usage::BOTH).unwrap();
        prop_assert_eq!(&mx.rowwise.as_ref().unwrap().codes, &mx.columnwise.as_ref().unwrap().codes);
        prop_assert_eq!(mx.dequantize(Direction::Rowwise).unwrap(), mx.dequantize(Direction::Columnwise).unwrap());
        let nv = quantize_nvfp4(&x, &Nvfp4Config { block_2d: true, rht: false, stochastic_seed: None }, Usage::BOTH).unwrap();
        let row = unpack_e2m1(&nv.rowwise.as_ref().unwrap().codes);
        let col = unpack_e2m1(&nv.columnwise.as_ref().unwrap().codes);
        prop_assert_eq!(transpose(&row, x.rows, x.cols), col);
        prop_assert_eq!(nv.dequantize(Direction::Rowwise).unwrap(), nv.dequantize(Direction::Columnwise).unwrap());
    }

    #[test]
    fn nvfp4_error_is_at_most_one_scale_unit(
        mb in 1usize..5, kb in 1usize..6, seed in any::<u64>(), spread in 0.0f64..4.0,
    ) {
        let x = random_matrix(16 * mb, 16 * kb, seed, spread);
        let q = quantize_nvfp4(&x, &Nvfp4Config { block_2d: false, rht: false, stochastic_seed: None }, Usage::BOTH).unwrap();
        let row = q.rowwise.as_ref().unwrap();
        let Scales::BlockBytes { shape, bytes, .. } = &row.scales else { panic!() };
        let s_enc = burn_lowp::format::nvfp4::global_encode_scale(row.amax.unwrap());
        let s_dec = 1.0 / s_enc;
        let dq = q.dequantize(Direction::Rowwise).unwrap();
        for r in 0..x.rows {
            for b in 0..kb {
                let unit = Fp8Format::E4M3.decode(bytes[r * shape[1] + b]) as f64 * s_dec as f64;
                for i in 0..16 {
                    let idx = r * x.cols + b * 16 + i;
                    let err = (x.values[idx] as f64 - dq[idx] as f64).abs();
                    if unit == 0.0 {
                        // The block scale underflowed E4M3: the block is tiny next to the tensor.
                        prop_assert_eq!(dq[idx], 0.0);
                        prop_assert!((x.values[idx].abs() * s_enc / 6.0) < 2f32.powi(-9));
                    } else {
                        prop_assert!(err <= unit * (1.0 + 1e-5), "err {err:e} > unit {unit:e}");
                    }
                }
            }
        }
        prop_assert_eq!(q.dequantize(Direction::Columnwise).unwrap().len(), x.values.len());
    }

    #[test]
    fn swizzle_round_trips(rows in 1usize..300, cols in 1usize..20, seed in any::<u64>()) {
        let mut rng = crate::common::SplitMix(seed);
        let compact: Vec<u8> = (0..rows * cols).map(|_| (rng.next_u64() % 255 + 1) as u8).collect();
        let s = swizzle::swizzle(&compact, rows, cols).unwrap();
        let [pr, pc] = swizzle::swizzled_shape(rows, cols);
        prop_assert_eq!(s.len(), pr * pc);
        prop_assert_eq!(s.iter().filter(|&&b| b != 0).count(), rows * cols);
        let back = swizzle::unswizzle(&s, rows, cols).unwrap();
        prop_assert_eq!(crate::common::crop_zero_padded(&back, pc, rows, cols), compact);
    }

    #[test]
    fn swizzled_tensors_unswizzle_to_the_same_bytes(
        mb in 1usize..6, kb in 1usize..6, seed in any::<u64>(), nvfp4 in any::<bool>(),
    ) {
        let x = random_matrix(32 * mb, 32 * kb, seed, 4.0);
        let q = if nvfp4 {
            quantize_nvfp4(&x, &Nvfp4Config { block_2d: false, rht: false, stochastic_seed: None }, Usage::BOTH)
        } else {
            quantize_mxfp8(&x, &Mxfp8Config { fp8: Fp8Format::E4M3, block_2d: false }, Usage::BOTH)
        }.unwrap();
        let mut s = q.clone();
        s.swizzle_scales().unwrap();
        prop_assert!(s != q);
        prop_assert!(s.dequantize(Direction::Rowwise).is_err(), "dequantize needs compact scales");
        s.unswizzle_scales().unwrap();
        prop_assert_eq!(s, q);
    }
}

#[test]
fn rht_columnwise_dequantizes_back_to_the_source() {
    let x = random_matrix(128, 64, 3, 0.0);
    let config = Nvfp4Config {
        block_2d: false,
        rht: true,
        stochastic_seed: None,
    };
    let q = quantize_nvfp4(&x, &config, Usage::BOTH).unwrap();
    let col = q.dequantize(Direction::Columnwise).unwrap();
    let (mut err, mut norm) = (0.0f64, 0.0f64);
    for (&a, &b) in x.values.iter().zip(&col) {
        err += ((a - b) as f64).powi(2);
        norm += (a as f64).powi(2);
    }
    // NVFP4 keeps roughly 3 bits: relative RMS error of Gaussian data is ~0.1.
    let rel = (err / norm).sqrt();
    assert!(rel < 0.15, "relative RMS error {rel}");
    let amax_t = q.columnwise.as_ref().unwrap().amax;
    assert_ne!(
        amax_t,
        q.rowwise.as_ref().unwrap().amax,
        "columnwise amax is taken after the RHT"
    );
}

#[test]
fn shapes_a_format_cannot_take_are_errors() {
    let x = random_matrix(48, 40, 1, 1.0);
    let err = quantize_mxfp8(
        &x,
        &Mxfp8Config {
            fp8: Fp8Format::E4M3,
            block_2d: false,
        },
        Usage::BOTH,
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("K = 40") && err.contains("divisible by 32"),
        "{err}"
    );
    let err = quantize_fp8_block(
        &random_matrix(100, 128, 1, 1.0),
        &Fp8BlockScaling::new(Fp8Format::E4M3, BlockShape::OneByOneTwentyEight),
        Usage::COLUMNWISE,
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("M = 100") && err.contains("divisible by 128"),
        "{err}"
    );
    // TE's rule: both dimensions, whatever the direction.
    let err = quantize_fp8_block(
        &random_matrix(100, 128, 1, 1.0),
        &Fp8BlockScaling::new(Fp8Format::E4M3, BlockShape::OneByOneTwentyEight),
        Usage::ROWWISE,
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("M = 100"), "{err}");
    let err = quantize_nvfp4(
        &random_matrix(32, 32, 1, 1.0),
        &Nvfp4Config {
            block_2d: true,
            rht: true,
            stochastic_seed: None,
        },
        Usage::BOTH,
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("16x16 blocks with RHT"), "{err}");
    let err = quantize_nvfp4(
        &random_matrix(24, 32, 1, 1.0),
        &Nvfp4Config {
            block_2d: false,
            rht: false,
            stochastic_seed: None,
        },
        Usage::BOTH,
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("M = 24"), "{err}");
    let err = quantize_fp8_current(
        &random_matrix(0, 0, 1, 1.0),
        &Fp8CurrentScaling::new(Fp8Format::E4M3),
        Usage::BOTH,
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("non-empty"), "{err}");
}
