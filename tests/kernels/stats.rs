//! The debug tools' one-pass tensor statistics (`LowpBackend::lowp_tensor_stats`) on every
//! backend: the per-tile partials equal the host reference (`debug::stats::tile_partials`) bit
//! for bit in counts, minima and maxima, within f32 summation order elsewhere and the runtime's
//! `ln` for the dynamic ranges; reduced, they equal statistics computed here in f64 from the
//! values directly; with a quantized copy, underflows and squared error equal those of the
//! reference quantizer's dequantized values, for every format.
#![allow(dead_code)]

use burn_lowp::backend::LowpBackend;
use burn_lowp::debug::config::TensorStat;
use burn_lowp::debug::stats::{self, TensorStats, STAT_FIELDS};
use burn_lowp::format::fp8_block::BlockShape;
use burn_lowp::format::{
    Direction, Fp8BlockScaling, Fp8CurrentScaling, Fp8Format, FormatConfig, HostMatrix, InputDtype,
    Mxfp8Config, Nvfp4Config, Usage,
};

use crate::common::{read_f32, SplitMix};

/// Values with exact zeros, tiny values and a wide range (so every field has work).
fn values(rows: usize, cols: usize, dtype: InputDtype, seed: u64) -> HostMatrix {
    let mut rng = SplitMix(seed);
    let v = (0..rows * cols)
        .map(|i| {
            let u = rng.uniform();
            let x = if u < 0.1 {
                0.0
            } else if u < 0.15 {
                1e-4 * rng.normal()
            } else {
                (rng.normal() * (8.0 * rng.uniform() - 4.0).exp2()) + if i % 7 == 0 { 3.0 } else { 0.0 }
            };
            dtype.round(x as f32)
        })
        .collect();
    HostMatrix::new("stats input", rows, cols, dtype, v).unwrap()
}

fn read_partials<B: LowpBackend>(bytes: &B::Bytes) -> Vec<f32> {
    B::bytes_to_host(bytes)
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}

/// Exact fields bit for bit, sums within f32 reassociation, log ranges within `ln`'s error.
fn assert_partials_match(got: &[f32], want: &[f32], context: &str) {
    assert_eq!(got.len(), want.len(), "{context}: tiles");
    for (t, (g, w)) in got.chunks_exact(STAT_FIELDS).zip(want.chunks_exact(STAT_FIELDS)).enumerate() {
        for f in 0..STAT_FIELDS {
            let (a, b) = (g[f], w[f]);
            let ok = match f {
                stats::NONZERO
                | stats::MIN
                | stats::MAX
                | stats::AMAX
                | stats::MIN_NONZERO_ABS
                | stats::UNDERFLOWS
                | stats::OVERFLOWS => a.to_bits() == b.to_bits(),
                stats::MAX_LN_RANGE_1D | stats::LN_RANGE_2D => (a - b).abs() <= 1e-4 * b.abs().max(1.0),
                // FMA contraction and the runtime's summation may differ from the host's order.
                _ => (a - b).abs() <= 1e-5 * b.abs().max(1e-30) + 1e-30,
            };
            assert!(ok, "{context}: tile {t} field {f}: {a} vs {b}");
        }
    }
}

/// `log2(amax) - log2(min non-zero)` of `v`, 0 without non-zeros.
fn log_range(v: impl Iterator<Item = f64>) -> f64 {
    let (mut amax, mut min) = (0.0f64, f64::INFINITY);
    for x in v {
        let a = x.abs();
        amax = amax.max(a);
        if a > 0.0 {
            min = min.min(a);
        }
    }
    if amax > 0.0 {
        amax.log2() - min.log2()
    } else {
        0.0
    }
}

fn close(got: f64, want: f64, rel: f64, what: &str) {
    assert!(
        (got - want).abs() <= rel * want.abs().max(1e-12),
        "{what}: {got} vs {want}"
    );
}

pub fn check_tensor_stats<B: LowpBackend>(device: &B::Device, dtypes: &[InputDtype]) {
    for &dtype in dtypes {
        for (rows, cols, seed) in [(64, 64, 1), (70, 98, 2), (5, 34, 3)] {
            let m = values(rows, cols, dtype, seed);
            let context = format!("{dtype:?} [{rows}, {cols}]");
            let x = B::float_from_host(&m, device);
            let partials = read_partials::<B>(&B::lowp_tensor_stats(x, None).unwrap());
            assert_partials_match(&partials, &stats::tile_partials(&m.values, rows, cols, None), &context);

            let s = TensorStats::from_partials(&partials, (rows * cols) as u64);
            let v: Vec<f64> = m.values.iter().map(|&x| x as f64).collect();
            let n = v.len() as f64;
            let mean = v.iter().sum::<f64>() / n;
            let std = (v.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / (n - 1.0)).sqrt();
            let at = |r: usize, c: usize| v[r * cols + c];
            let mut dr1 = 0.0f64;
            let mut dr2 = 0.0f64;
            for r0 in (0..rows).step_by(32) {
                for c0 in (0..cols).step_by(32) {
                    let (r1, c1) = ((r0 + 32).min(rows), (c0 + 32).min(cols));
                    dr2 = dr2.max(log_range((r0..r1).flat_map(|r| (c0..c1).map(move |c| (r, c))).map(|(r, c)| at(r, c))));
                    for r in r0..r1 {
                        dr1 = dr1.max(log_range((c0..c1).map(|c| at(r, c))));
                    }
                }
            }
            let checks = [
                (TensorStat::Min, v.iter().cloned().fold(f64::INFINITY, f64::min), 0.0),
                (TensorStat::Max, v.iter().cloned().fold(f64::NEG_INFINITY, f64::max), 0.0),
                (TensorStat::Mean, mean, 1e-5),
                (TensorStat::Std, std, 1e-5),
                (TensorStat::L1Norm, v.iter().map(|x| x.abs()).sum(), 1e-5),
                (TensorStat::L2Norm, v.iter().map(|x| x * x).sum::<f64>().sqrt(), 1e-5),
                (TensorStat::CurAmax, v.iter().map(|x| x.abs()).fold(0.0, f64::max), 0.0),
                (TensorStat::DynamicRange, log_range(v.iter().cloned()), 1e-9),
                (TensorStat::MaxBlockwiseDynamicRange1d, dr1, 1e-5),
                (TensorStat::MaxBlockwiseDynamicRange2d, dr2, 1e-5),
            ];
            for (stat, want, rel) in checks {
                close(s.stat(stat), want, rel, &format!("{context} {stat:?}"));
            }
        }
    }
}

/// Underflows, squared error and overflows against a quantized copy, for every format.
pub fn check_quantization_error_stats<B: LowpBackend>(device: &B::Device) {
    let (rows, cols) = (128, 128);
    let m = values(rows, cols, InputDtype::F32, 9);
    let formats = [
        FormatConfig::Fp8Current(Fp8CurrentScaling::new(Fp8Format::E4M3)),
        FormatConfig::Fp8Current(Fp8CurrentScaling::new(Fp8Format::E5M2)),
        FormatConfig::Fp8Block(Fp8BlockScaling { fp8: Fp8Format::E4M3, block: BlockShape::OneByOneTwentyEight, pow2_scales: true, amax_epsilon: 0.0 }),
        FormatConfig::Mxfp8(Mxfp8Config { fp8: Fp8Format::E4M3, block_2d: false }),
        FormatConfig::Nvfp4(Nvfp4Config { block_2d: false, rht: false, stochastic_seed: None }),
    ];
    for config in formats {
        let x = B::float_from_host(&m, device);
        let q = B::lowp_quantize(x.clone(), &config, Usage { rowwise: true, columnwise: true }, false).unwrap();
        for direction in [Direction::Rowwise, Direction::Columnwise] {
            let context = format!("{:?} {direction:?}", config.format());
            // The reference dequantization of the very codes the backend wrote.
            let reference = q.to_host().unwrap().dequantize(direction).unwrap();
            let dq = B::lowp_dequantize(&q, direction).unwrap();
            assert_eq!(read_f32::<B>(dq.clone()), reference, "{context}: dequantized copy");
            let limit_value = 0.5f32;
            let limit = B::float_from_host(
                &HostMatrix::new("limit", 1, 1, InputDtype::F32, vec![limit_value]).unwrap(),
                device,
            );
            let partials = read_partials::<B>(&B::lowp_tensor_stats(x.clone(), Some((dq, limit))).unwrap());
            assert_partials_match(
                &partials,
                &stats::tile_partials(&m.values, rows, cols, Some((&reference, limit_value))),
                &context,
            );
            let s = TensorStats::from_partials(&partials, (rows * cols) as u64);
            let underflows = m.values.iter().zip(&reference).filter(|(x, d)| **x != 0.0 && **d == 0.0).count();
            let sq: f64 = m.values.iter().zip(&reference).map(|(x, d)| (*x as f64 - *d as f64).powi(2)).sum();
            let overflows = m.values.iter().filter(|x| x.abs() > limit_value).count();
            let e = s.quantization_error();
            assert_eq!(e.underflow_pct, 100.0 * underflows as f64 / (rows * cols) as f64, "{context}: underflow %");
            close(e.mse, sq / (rows * cols) as f64, 1e-5, &format!("{context}: mse"));
            assert_eq!(s.overflows as usize, overflows, "{context}: overflows");
        }
    }
}

macro_rules! stats_suite {
    ($backend:ty, $device:expr, $dtypes:expr) => {
        #[test]
        fn tensor_stats_match_the_reference_and_f64() {
            if let Some(d) = $device {
                crate::stats::check_tensor_stats::<$backend>(&d, &$dtypes);
            }
        }

        #[test]
        fn quantization_error_stats_match_the_reference_dequantization() {
            if let Some(d) = $device {
                crate::stats::check_quantization_error_stats::<$backend>(&d);
            }
        }
    };
}
pub(crate) use stats_suite;
