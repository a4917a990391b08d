//! Delayed scaling: casts with a scale from the module's state against the reference, the amaxes
//! they record into the amax history, and the end-of-step history update against its tensor-op
//! twin.
#![allow(dead_code)]

use burn_lowp::backend::{Groups, LowpBackend, ScaleColumns};
use burn_lowp::format::grouped::GroupScaling;
use burn_lowp::format::{quantize_fp8_with_scale, Fp8Format, InputDtype, Usage};

use crate::common::{read_f32, SplitMix};
use crate::suite::*;

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
                // The scale read in place from column 3 of a module's scales.
                let ours = B::quantize_fp8_with_scale(
                    B::bytes_float_from_host(&x, device),
                    fp8,
                    scale_state::<B>(&[scale], 3, 1, device),
                    Usage::BOTH,
                    None,
                )
                .unwrap();
                assert_bit_equal(&ours.to_host().unwrap(), &reference, &context);
            }
        }
    }
    // Scale columns past the module's scales are an error, not a read past them (plain and
    // grouped).
    let x = input(96, 160, InputDtype::F32, 5);
    let narrow = ScaleColumns { first: 2, ..scale_state::<B>(&[1.0], 0, 1, device) };
    let err = B::quantize_fp8_with_scale(B::bytes_float_from_host(&x, device), Fp8Format::E4M3, narrow, Usage::BOTH, None)
        .unwrap_err()
        .to_string();
    assert!(err.contains("scales") && err.contains("2 + g * 1"), "{err}");
    let (x, groups) = grouped_input(&[64, 64], 128, 128, InputDtype::F32, 7);
    let device_groups = Groups::<B>::from_host(groups, x.rows, device).unwrap();
    let narrow = ScaleColumns { stride: 3, ..scale_state::<B>(&[1.0, 1.0], 0, 1, device) };
    let err = B::grouped_quantize_fp8_with_scale(B::bytes_float_from_host(&x, device), Fp8Format::E4M3, narrow, &device_groups,
        Usage::BOTH, GroupScaling::PerGroup, None)
        .unwrap_err()
        .to_string();
    assert!(err.contains("scales") && err.contains("for 2 groups"), "{err}");
    // A stride whose columns overflow the index range is the same error, not a panic.
    let huge = ScaleColumns { stride: usize::MAX, ..scale_state::<B>(&[1.0, 1.0], 0, 1, device) };
    let err = B::grouped_quantize_fp8_with_scale(B::bytes_float_from_host(&x, device), Fp8Format::E4M3, huge, &device_groups,
        Usage::BOTH, GroupScaling::PerGroup, None)
        .unwrap_err()
        .to_string();
    assert!(err.contains("scales"), "{err}");
}

/// The largest |v| of `values`, NaN counted as 0 (the casts' amax rule), computed here.
fn host_amax(values: &[f32]) -> f32 {
    values.iter().map(|v| if v.is_nan() { 0.0 } else { v.abs() }).fold(0.0f32, f32::max)
}

/// Delayed casts on a backend that records in place (`quantize_delayed_amax_in_place`) fold each group's
/// amax into its column of the history's row 0 with a maximum (a second cast, the next
/// micro-batch, keeps the larger) and write nothing else: plain, grouped (columns `1 + 3g`, an
/// empty group among them) and padded grouped casts, and a history made by `zeros`. The amaxes
/// are taken here from the inputs.
/// NdArray records with tensor ops instead (`tests/recipes.rs` checks that path).
pub fn check_delayed_casts_record_into_history<B: LowpBackend>(device: &B::Device, dtypes: &[InputDtype]) {
    use burn_lowp::backend::{AmaxHistoryColumns, GroupedFp8Scaling};
    if !B::quantize_delayed_amax_in_place() {
        return;
    }
    let (len, width) = (4usize, 16usize);
    // Row 0 holds amaxes recorded earlier in the step; rows 1.. older steps.
    let prefill: Vec<f32> = (0..len * width).map(|i| 0.3 * (i % 7) as f32).collect();
    let record = |history: &burn::tensor::ops::FloatTensor<B>, first: usize, stride: usize| {
        Some(AmaxHistoryColumns { history: history.clone(), first, stride })
    };
    let one = |v: f32| ScaleColumns::whole(f32_tensor::<B>(vec![v], 1, 1, device));
    for &dtype in dtypes {
        // Plain: column 5, two casts.
        let history = f32_tensor::<B>(prefill.clone(), len, width, device);
        let mut expected = prefill.clone();
        for seed in [3u64, 4] {
            let x = input(96, 160, dtype, seed);
            B::quantize_fp8_with_scale(B::bytes_float_from_host(&x, device), Fp8Format::E4M3, one(0.5), Usage::BOTH, record(&history, 5, 1)).unwrap();
            expected[5] = expected[5].max(host_amax(&x.values));
            assert_eq!(read_f32::<B>(history.clone()), expected, "plain delayed cast, {} seed {seed}", dtype.name());
        }
        // Grouped, aligned rows and packed rows read through the layout.
        let (splits, tokens) = (vec![0i32, 200, 37, 63], 300usize);
        let scales = scale_state::<B>(&[0.5, 3.0, 1.0, 100.0], 0, 1, device);
        let (x, groups) = grouped_input(&splits, tokens, 128, dtype, 11);
        let device_groups = Groups::<B>::from_host(groups.clone(), x.rows, device).unwrap();
        let history = f32_tensor::<B>(prefill.clone(), len, width, device);
        let mut expected = prefill.clone();
        for shared in [GroupScaling::PerGroup, GroupScaling::Shared] {
            B::grouped_quantize_fp8_with_scale(B::bytes_float_from_host(&x, device), Fp8Format::E5M2, scales.clone(), &device_groups,
                Usage::ROWWISE, shared, record(&history, 1, 3)).unwrap();
        }
        for (g, group) in groups.iter().enumerate() {
            let rows = &x.values[group.start * 128..(group.start + group.len) * 128];
            expected[1 + 3 * g] = expected[1 + 3 * g].max(host_amax(rows));
        }
        assert_eq!(read_f32::<B>(history.clone()), expected, "grouped delayed casts, {}", dtype.name());

        let packed = input(tokens, 400, dtype, 12);
        let m_splits = burn::tensor::Tensor::<B, 1, burn::tensor::Int>::from_data(
            burn::tensor::TensorData::new(splits.iter().map(|&v| v as i64).collect::<Vec<_>>(), [splits.len()]),
            device,
        );
        let layout = B::grouped_layout(m_splits.into_primitive(), tokens).unwrap();
        let history = f32_tensor::<B>(prefill.clone(), len, width, device);
        let scaling = GroupedFp8Scaling::Delayed { fp8: Fp8Format::E4M3, scales: scales.clone(), record: record(&history, 2, 2) };
        B::grouped_quantize_fp8_padded(B::bytes_float_from_host(&packed, device), &layout, scaling, Usage::BOTH, GroupScaling::PerGroup).unwrap();
        let mut expected = prefill.clone();
        let mut start = 0usize;
        for (g, &n) in splits.iter().enumerate() {
            let rows = &packed.values[start * 400..(start + n as usize) * 400];
            expected[2 + 2 * g] = expected[2 + 2 * g].max(host_amax(rows));
            start += n as usize;
        }
        assert_eq!(read_f32::<B>(history), expected, "padded grouped delayed cast, {}", dtype.name());
    }
    // A history made by `zeros` (CubeCL may pitch its rows: [1024, 3] f32 is not contiguous on
    // CUDA), as a module's state starts.
    let zeros = B::float_zeros(burn::tensor::Shape::new([1024, 3]), device, burn::tensor::FloatDType::F32);
    let x = input(96, 160, InputDtype::F32, 6);
    B::quantize_fp8_with_scale(B::bytes_float_from_host(&x, device), Fp8Format::E4M3, one(1.0), Usage::ROWWISE, record(&zeros, 2, 1)).unwrap();
    let mut expected = vec![0.0f32; 1024 * 3];
    expected[2] = host_amax(&x.values);
    assert_eq!(read_f32::<B>(zeros), expected, "delayed cast into a zeros history");
    // A history that cannot hold the columns is an error, not a write past its row.
    let history = f32_tensor::<B>(prefill.clone(), len, width, device);
    let x = input(96, 160, InputDtype::F32, 5);
    let err = B::quantize_fp8_with_scale(B::bytes_float_from_host(&x, device), Fp8Format::E4M3, one(1.0), Usage::BOTH, record(&history, width, 1))
        .unwrap_err()
        .to_string();
    assert!(err.contains("amax history"), "{err}");
}

/// `quantize_delayed_update` (one kernel on CubeCL backends) equals its tensor-op twin
/// (`delayed_update_by_ops`) bit for bit, new history and new scales: histories of 1, 2, 5,
/// 1024 and 1100 rows (the twin's blocked max has a tail there), 1 to 70 slots, `max` and
/// `most_recent`, with zero, infinite, subnormal (the scale overflows to f32::MAX) and ordinary
/// amaxes; scales and histories that disagree are an error on both.
pub fn check_delayed_update_matches_tensor_ops<B: LowpBackend>(device: &B::Device) {
    use burn_lowp::quant::delayed::delayed_update_by_ops;
    let mut cases = 0;
    for (len, width) in [(1usize, 1usize), (2, 3), (5, 24), (1024, 40), (1100, 70)] {
        let mut rng = SplitMix((len * 131 + width) as u64);
        let history: Vec<f32> = (0..len * width)
            .map(|i| match rng.next_u64() % 11 {
                0 => 0.0,
                1 if i % 5 == 0 => f32::INFINITY,
                2 => 1.0e-45,
                3 => 3.0e38,
                _ => (rng.uniform() * 900.0) as f32,
            })
            .collect();
        let scale: Vec<f32> = (0..width).map(|_| 0.01 + rng.uniform() as f32 * 1000.0).collect();
        for most_recent in [false, true] {
            for numerator in [448.0f32, 57344.0 / 2.0] {
                let inputs = || (f32_tensor::<B>(history.clone(), len, width, device), B::float_reshape(f32_tensor::<B>(scale.clone(), 1, width, device), burn::tensor::Shape::new([width])));
                let (h, s) = inputs();
                let (h_ops, s_ops) = delayed_update_by_ops::<B>(h, s, numerator, most_recent).unwrap();
                let (h, s) = inputs();
                let (h_k, s_k) = B::quantize_delayed_update(h, s, numerator, most_recent).unwrap();
                let bits = |v: Vec<f32>| v.into_iter().map(f32::to_bits).collect::<Vec<_>>();
                let context = format!("history {len}x{width}, most_recent {most_recent}, numerator {numerator}");
                assert_eq!(bits(read_f32::<B>(s_k)), bits(read_f32::<B>(s_ops)), "{context}: scales");
                assert_eq!(bits(read_f32::<B>(h_k)), bits(read_f32::<B>(h_ops)), "{context}: history");
                cases += 1;
            }
        }
    }
    let wrong = B::float_reshape(f32_tensor::<B>(vec![1.0; 4], 1, 4, device), burn::tensor::Shape::new([4]));
    assert!(B::quantize_delayed_update(f32_tensor::<B>(vec![0.0; 6], 2, 3, device), wrong.clone(), 448.0, false).is_err());
    assert!(delayed_update_by_ops::<B>(f32_tensor::<B>(vec![0.0; 6], 2, 3, device), wrong, 448.0, false).is_err());
    println!("{cases} delayed-scaling updates equal their tensor-op twin");
}
