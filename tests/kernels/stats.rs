//! The debug tools' one-pass tensor statistics (`StatsOps::stats_tensor`) on every
//! backend: the partials (tiles folded into 128x2048 records) equal the host reference
//! (`debug::stats::tile_partials`, then `record_partials`) bit for bit in counts, minima and
//! maxima, within f32 summation order elsewhere and the runtime's `ln` for the dynamic ranges;
//! reduced, they equal statistics computed here in f64 from the values directly; with a
//! quantized copy, underflows and squared error equal those of the reference quantizer's
//! dequantized values, for every format.
#![allow(dead_code)]

use burn::tensor::ops::FloatTensor;
use burn_lowp::backend::LowpBackend;
use burn_lowp::format::QuantFormat;
use burn_lowp::quant::{QuantizedTensor, StorageScales};
use burn_lowp::debug::config::TensorStat;
use burn_lowp::debug::stats::{self, TensorStats, STAT_FIELDS};
use burn_lowp::format::fp8_block::BlockShape;
use burn_lowp::format::{
    Direction, Fp8BlockScaling, Fp8CurrentScaling, Fp8Format, FormatConfig, HostMatrix, InputDtype,
    Mxfp8Config, Nvfp4Config, Usage,
};

use burn_lowp::backend::grouped::{dequantize_group_by_group, host_group_layout};
use burn_lowp::format::grouped::group_layout;

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

/// The records the device returns for `tiles` of a `[rows, cols]` tensor.
fn records(tiles: Vec<f32>, rows: usize, cols: usize) -> Vec<f32> {
    stats::record_partials(&tiles, rows, cols)
}

/// Exact fields bit for bit, sums within f32 reassociation, log ranges within `ln`'s error.
fn assert_partials_match(got: &[f32], want: &[f32], context: &str) {
    assert_eq!(got.len(), want.len(), "{context}: records");
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
            assert!(ok, "{context}: record {t} field {f}: {a} vs {b}");
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
        // The last shape spans 3 x 2 records, the last of each row and column partial.
        for (rows, cols, seed) in [(64, 64, 1), (70, 98, 2), (5, 34, 3), (260, 2180, 4)] {
            let m = values(rows, cols, dtype, seed);
            let context = format!("{dtype:?} [{rows}, {cols}]");
            let x = B::bytes_float_from_host(&m, device);
            let partials = read_partials::<B>(&B::stats_tensor(x, None, None).unwrap());
            assert_eq!(partials.len(), stats::stats_records(rows, cols) * STAT_FIELDS, "{context}: record count");
            assert_partials_match(&partials, &records(stats::tile_partials(&m.values, rows, cols, None, None), rows, cols), &context);

            let s = TensorStats::from_partials(&partials);
            assert_eq!(s.numel, (rows * cols) as u64, "{context}: elements");
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
        let x = B::bytes_float_from_host(&m, device);
        let q = B::quantize_tensor(x.clone(), &config, Usage { rowwise: true, columnwise: true }, false).unwrap();
        for direction in [Direction::Rowwise, Direction::Columnwise] {
            let context = format!("{:?} {direction:?}", config.format());
            // The reference dequantization of the very codes the backend wrote.
            let reference = q.to_host().unwrap().dequantize(direction).unwrap();
            let dq = B::quantize_dequantize(&q, direction).unwrap();
            assert_eq!(read_f32::<B>(dq.clone()), reference, "{context}: dequantized copy");
            let limit_value = 0.5f32;
            let limit = B::bytes_float_from_host(
                &HostMatrix::new("limit", 1, 1, InputDtype::F32, vec![limit_value]).unwrap(),
                device,
            );
            let partials = read_partials::<B>(&B::stats_tensor(x.clone(), Some((dq, limit)), None).unwrap());
            assert_partials_match(
                &partials,
                &records(stats::tile_partials(&m.values, rows, cols, Some((&reference, &[limit_value])), None), rows, cols),
                &context,
            );
            let s = TensorStats::from_partials(&partials);
            assert_eq!(s.numel, (rows * cols) as u64, "{context}: elements");
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

/// Every expert's statistics of a grouped tensor from one launch (rows labelled by expert, as
/// the MoE layer's debug observation runs them) equal the statistics of that expert's own token
/// rows taken alone, bit for bit, with and without a quantized copy, for every format; the
/// padding rows (filled with large values here, which would show in min, max and the sums) stay
/// out; the partials equal the host reference with labels; and the grouped dequantize (one kernel
/// for the FP8 formats on CubeCL backends) equals dequantizing each group's view.
pub fn check_grouped_stats<B: LowpBackend>(device: &B::Device) {
    let (splits, tokens, cols) = (vec![0i32, 200, 37, 63], 300usize, 128usize);
    let host = group_layout(&splits, tokens);
    let count = splits.len();
    let (mut x, groups) = crate::suite::grouped_input(&splits, tokens, cols, InputDtype::F32, 23);
    // (The quantize tests' inputs hold subnormals; lavapipe flushes them to zero, which would
    // move the log ranges away from the host reference's.)
    for v in x.values.iter_mut().filter(|v| v.abs() < f32::MIN_POSITIVE) {
        *v = 0.0;
    }
    for (row, &g) in host.row_group.iter().enumerate() {
        if g as usize == count {
            for c in 0..cols {
                x.values[row * cols + c] = 1000.0 + c as f32;
            }
        }
    }
    let layout = host_group_layout::<B>(&splits, tokens, device);
    let labels: Vec<u32> = host.row_group.iter().map(|&g| g as u32).collect();
    let limits = [0.5f32, 1.0, 2.0, 0.25];
    let limit_tensor = B::bytes_float_from_host(&HostMatrix::new("limits", 1, count, InputDtype::F32, limits.to_vec()).unwrap(), device);
    let xt = B::bytes_float_from_host(&x, device);
    let row_slice = |values: &[f32], g: usize| {
        let group = groups[g];
        values[group.start * cols..(group.start + group.used) * cols].to_vec()
    };
    // Statistics of expert g's rows alone (the ungrouped kernel), against the grouped read's part.
    let check_group = |grouped: &[u8], g: usize, error: Option<&[f32]>, context: &str| {
        let used = groups[g].used;
        let got = TensorStats::from_partial_bytes(&stats::split_partials_by_group(grouped, count)[g]);
        if used == 0 {
            assert_eq!(got.numel, 0, "{context}: group {g} has no tokens");
            return;
        }
        let part = |v: Vec<f32>| B::bytes_float_from_host(&HostMatrix::new("slice", used, cols, InputDtype::F32, v).unwrap(), device);
        let error = error.map(|dq| {
            let limit = HostMatrix::new("limit", 1, 1, InputDtype::F32, vec![limits[g]]).unwrap();
            (part(row_slice(dq, g)), B::bytes_float_from_host(&limit, device))
        });
        let alone = B::stats_tensor(part(row_slice(&x.values, g)), error, None).unwrap();
        let want = TensorStats::from_partial_bytes(&B::bytes_to_host(&alone));
        assert_eq!(got, want, "{context}: group {g}");
        assert_eq!(got.numel, (used * cols) as u64, "{context}: group {g} elements");
    };
    let row_labels = stats::RowLabels { row_group: &labels, count };
    let grouped = B::stats_tensor(xt.clone(), None, Some((layout.row_group.clone(), count))).unwrap();
    let grouped = B::bytes_to_host(&grouped);
    let reference = records(stats::tile_partials(&x.values, x.rows, cols, None, Some(row_labels)), x.rows, cols);
    assert_partials_match(&stats::partials_from_bytes(&grouped), &reference, "grouped");
    for g in 0..count {
        check_group(&grouped, g, None, "grouped");
    }
    for (name, config) in crate::suite::configs() {
        let q = B::grouped_quantize(xt.clone(), &layout.groups, &config, Usage::BOTH, Default::default()).unwrap();
        for direction in [Direction::Rowwise, Direction::Columnwise] {
            let context = format!("{name} {direction:?}");
            let dq = B::grouped_dequantize(&q, direction, &layout.groups, &layout.row_group).unwrap();
            let dq = read_f32::<B>(dq);
            let by_group = read_f32::<B>(dequantize_group_by_group::<B>(&q, direction, &layout.groups).unwrap());
            for (row, &g) in labels.iter().enumerate() {
                if (g as usize) < count {
                    let r = row * cols..(row + 1) * cols;
                    assert!(
                        dq[r.clone()].iter().zip(&by_group[r]).all(|(a, b)| a.to_bits() == b.to_bits()),
                        "{context}: grouped dequantize, row {row}"
                    );
                }
            }
            let dqt = B::bytes_float_from_host(&HostMatrix::new("dq", x.rows, cols, InputDtype::F32, dq.clone()).unwrap(), device);
            let grouped = B::stats_tensor(
                xt.clone(),
                Some((dqt, limit_tensor.clone())),
                Some((layout.row_group.clone(), count)),
            )
            .unwrap();
            let grouped = B::bytes_to_host(&grouped);
            let reference = records(stats::tile_partials(&x.values, x.rows, cols, Some((&dq, &limits)), Some(row_labels)), x.rows, cols);
            assert_partials_match(&stats::partials_from_bytes(&grouped), &reference, &context);
            for g in 0..count {
                check_group(&grouped, g, Some(&dq), &context);
            }
        }
    }
}

/// The overflow limit the debug tools measure a copy against (`debug::layer`'s unfused form):
/// `fp8_max · scale_inv` per group for FP8 per-tensor scales, +inf for block scales.
fn overflow_limit<B: LowpBackend>(q: &QuantizedTensor<B>, direction: Direction, groups: usize, device: &B::Device) -> FloatTensor<B> {
    let storage = q.quantized(direction).unwrap();
    match (&storage.format, &storage.scales) {
        (QuantFormat::Fp8Tensor { fp8 }, StorageScales::TensorScaleInv(s)) => {
            B::float_mul_scalar(B::bytes_as_float(s, [1, groups]), fp8.max().into())
        }
        _ => B::bytes_as_float(&B::bytes_from_host(f32::INFINITY.to_le_bytes().repeat(groups), device), [1, groups]),
    }
}

fn assert_bytes_equal<B: LowpBackend>(fused: &B::Bytes, unfused: &B::Bytes, context: &str) {
    let (a, b) = (read_partials::<B>(fused), read_partials::<B>(unfused));
    assert_eq!(a.len(), b.len(), "{context}: records");
    for (i, (x, y)) in a.iter().zip(&b).enumerate() {
        assert_eq!(x.to_bits(), y.to_bits(), "{context}: record {} field {}: {x} vs {y}", i / STAT_FIELDS, i % STAT_FIELDS);
    }
}

/// The direction sets a decoding pass is asked for: each alone, and both in either order.
const DIRECTION_SETS: [&[Direction]; 4] = [
    &[Direction::Rowwise],
    &[Direction::Columnwise],
    &[Direction::Rowwise, Direction::Columnwise],
    &[Direction::Columnwise, Direction::Rowwise],
];

/// Asks the decoding pass for every direction set and compares each set of records with the
/// unfused twin's for its direction (`unfused(direction)`); `false` where the backend answered
/// `None` (every set then must).
fn check_direction_sets<B: LowpBackend>(
    fused: impl Fn(&[Direction]) -> Option<Vec<B::Bytes>>,
    unfused: impl Fn(Direction) -> B::Bytes,
    context: &str,
) -> bool {
    let mut decoded = None;
    for set in DIRECTION_SETS {
        let got = fused(set);
        assert!(decoded.is_none() || decoded == Some(got.is_some()), "{context}: {set:?} answered unlike the other sets");
        decoded = Some(got.is_some());
        let Some(got) = got else { continue };
        assert_eq!(got.len(), set.len(), "{context}: {set:?}: one set of records per direction");
        for (direction, bytes) in set.iter().zip(&got) {
            assert_bytes_equal::<B>(bytes, &unfused(*direction), &format!("{context} {direction:?} of {set:?}"));
        }
    }
    decoded == Some(true)
}

/// The statistics pass that decodes FP8 codes itself (`stats_quantization`) equals its
/// unfused twin (dequantize, the overflow limit from the scales, then the statistics pass) bit
/// for bit: FP8 per-tensor and block formats, each direction alone and both in one pass, every
/// dtype, plain tensors (also with the token rows cut short of the codes' rows, as a token
/// tensor leaves its padding out, and measured against a copy quantized with a 4x smaller scale
/// so that values overflow) and grouped tensors with an empty expert. Backends and formats
/// without the pass answer `None`.
pub fn check_decoded_quantization_stats<B: LowpBackend>(device: &B::Device, dtypes: &[InputDtype], decodes: bool) {
    let decoded = |config: &FormatConfig| {
        decodes && matches!(config, FormatConfig::Fp8Current(_) | FormatConfig::Fp8Block(_))
    };
    // The FP8 formats, and one of each other family (which must answer `None`).
    let configs: Vec<_> = crate::suite::configs()
        .into_iter()
        .filter(|(name, _)| name.starts_with("fp8") || *name == "mxfp8-e4m3" || *name == "nvfp4")
        .collect();
    for &dtype in dtypes {
        for (name, config) in configs.clone() {
            let (rows, cols) = match config {
                FormatConfig::Fp8Block(_) => (256, 384),
                FormatConfig::Mxfp8(_) => (96, 160),
                _ => (160, 288),
            };
            let m = values(rows, cols, dtype, 31);
            let quarter = HostMatrix::new("quarter", rows, cols, dtype, m.values.iter().map(|v| dtype.round(v * 0.25)).collect()).unwrap();
            // Only per-tensor scales have an overflow limit: the smaller scale is their case.
            let sources = if matches!(config, FormatConfig::Fp8Current(_)) { 2 } else { 1 };
            for (source, copy_of) in [("own copy", &m), ("4x smaller scale", &quarter)].into_iter().take(sources) {
                let q = B::quantize_tensor(B::bytes_float_from_host(copy_of, device), &config, Usage::BOTH, false).unwrap();
                for data_rows in [rows, rows - 3] {
                    let context = format!("{name} {dtype:?} {source} {data_rows} of {rows} rows");
                    let xs = B::bytes_float_from_host(
                        &HostMatrix::new("x", data_rows, cols, dtype, m.values[..data_rows * cols].to_vec()).unwrap(),
                        device,
                    );
                    let unfused = |direction: Direction| {
                        let dq = read_f32::<B>(B::quantize_dequantize(&q, direction).unwrap());
                        let dq = B::bytes_float_from_host(
                            &HostMatrix::new("dq", data_rows, cols, InputDtype::F32, dq[..data_rows * cols].to_vec()).unwrap(),
                            device,
                        );
                        B::stats_tensor(xs.clone(), Some((dq, overflow_limit::<B>(&q, direction, 1, device))), None).unwrap()
                    };
                    let fused = |set: &[Direction]| B::stats_quantization(xs.clone(), &q, set, None).unwrap();
                    let was_decoded = check_direction_sets::<B>(fused, unfused, &context);
                    assert_eq!(was_decoded, decoded(&config), "{context}: whether the backend decodes this format");
                    if was_decoded && source != "own copy" {
                        let got = B::stats_quantization(xs.clone(), &q, &[Direction::Rowwise], None).unwrap().unwrap();
                        let overflows = TensorStats::from_partials(&read_partials::<B>(&got[0])).overflows;
                        assert!(overflows > 0.0, "{context}: the smaller scale must overflow");
                    }
                }
            }
        }
        // Grouped: every expert's rows of one aligned matrix, one launch.
        let (splits, tokens, cols) = (vec![0i32, 200, 37, 63], 300usize, 256usize);
        let count = splits.len();
        let (xg, _) = crate::suite::grouped_input(&splits, tokens, cols, dtype, 37);
        let layout = host_group_layout::<B>(&splits, tokens, device);
        let xt = B::bytes_float_from_host(&xg, device);
        for (name, config) in configs.clone() {
            let q = match B::grouped_quantize(xt.clone(), &layout.groups, &config, Usage::BOTH, Default::default()) {
                Ok(q) => q,
                // (A format the grouped quantize does not take is no case here.)
                Err(_) => continue,
            };
            let context = format!("grouped {name} {dtype:?}");
            let unfused = |direction: Direction| {
                let dq = B::grouped_dequantize(&q, direction, &layout.groups, &layout.row_group).unwrap();
                let labels = Some((layout.row_group.clone(), count));
                B::stats_tensor(xt.clone(), Some((dq, overflow_limit::<B>(&q, direction, count, device))), labels).unwrap()
            };
            let fused = |set: &[Direction]| {
                B::stats_quantization(xt.clone(), &q, set, Some((&layout.groups, layout.row_group.clone()))).unwrap()
            };
            let was_decoded = check_direction_sets::<B>(fused, unfused, &context);
            assert_eq!(was_decoded, decoded(&config), "{context}: whether the backend decodes this format");
        }
    }
}

macro_rules! stats_suite {
    ($backend:ty, $device:expr, $dtypes:expr, $decodes:expr) => {
        #[test]
        fn tensor_stats_match_the_reference_and_f64() {
            if let Some(d) = $device {
                crate::stats::check_tensor_stats::<$backend>(&d, &$dtypes);
            }
        }

        #[test]
        fn grouped_stats_equal_each_experts_own_statistics() {
            if let Some(d) = $device {
                crate::stats::check_grouped_stats::<$backend>(&d);
            }
        }

        #[test]
        fn decoded_quantization_stats_equal_dequantize_then_stats() {
            if let Some(d) = $device {
                crate::stats::check_decoded_quantization_stats::<$backend>(&d, &$dtypes, $decodes);
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
