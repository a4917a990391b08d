//! Grouped (MoE) matrices: the device group layout against the host reference, grouped casts
//! against quantizing each group's slice (with per-group or shared scales, padded or gathered
//! inputs), and the grouped bias gradient, row gather and GEMM epilogue against references.
#![allow(dead_code)]

use burn_lowp::backend::grouped::group_view;
use burn_lowp::backend::{Groups, LowpBackend, RowGroup};
use burn_lowp::format::grouped::{group_config, group_layout, GroupScaling, SplitStatus};
use burn_lowp::format::{
    quantize, quantize_fp8_with_scale, Direction, FormatConfig, Fp8CurrentScaling, Fp8Format,
    HostMatrix, InputDtype, Usage,
};
use burn_lowp::quant::{QuantizedTensor, Storage, StorageScales};

use crate::common::read_f32;
use crate::suite::*;

/// A group layout dropped before anyone read its splits leaves the device's later reads working:
/// its host copy is still in flight when it goes (on wgpu, cubecl-wgpu 0.10 handed the staging
/// buffer of a dropped read back while still mapped, and the next read failed wgpu's validation).
pub fn check_dropped_group_layout_leaves_reads_working<B: LowpBackend>(device: &B::Device) {
    for _ in 0..3 {
        let m_splits = burn::tensor::Tensor::<B, 1, burn::tensor::Int>::from_data(
            burn::tensor::TensorData::new(vec![0i64, 200, 37, 63], [4]),
            device,
        );
        drop(B::grouped_layout(m_splits.into_primitive(), 300).unwrap());
        let values: Vec<f32> = (0..64).map(|i| i as f32).collect();
        assert_eq!(read_f32::<B>(f32_tensor::<B>(values.clone(), 4, 16, device)), values);
    }
}

/// Split vectors for the grouped tests: empty groups first, last and between, one group holding
/// every token, groups that are not multiples of the alignment, and bad ones (negative, wrong sum).
pub fn split_cases() -> Vec<(Vec<i32>, usize)> {
    vec![
        (vec![0, 200, 37, 63], 300),
        (vec![300, 0, 0, 0], 300),
        (vec![1, 1, 0, 128, 129, 0], 259),
        (vec![7], 7),
        (vec![40, -3, 50], 87),
        (vec![40, 30, 50], 100),
        (vec![90, 30, 50], 100),
    ]
}

fn ints<B: LowpBackend>(t: burn::tensor::ops::IntTensor<B>) -> Vec<i32> {
    burn::tensor::Tensor::<B, 1, burn::tensor::Int>::from_primitive(t)
        .into_data()
        .convert::<i64>()
        .into_vec::<i64>()
        .unwrap()
        .into_iter()
        .map(|v| v as i32)
        .collect()
}

/// The device layout of split sizes (groups, row maps, the splits' check) equals the host
/// reference, for good and bad splits.
pub fn check_group_layout_matches_reference<B: LowpBackend>(device: &B::Device) {
    for (splits, tokens) in split_cases() {
        let reference = group_layout(&splits, tokens);
        let m_splits = burn::tensor::Tensor::<B, 1, burn::tensor::Int>::from_data(
            burn::tensor::TensorData::new(splits.iter().map(|&v| v as i64).collect::<Vec<_>>(), [splits.len()]),
            device,
        );
        let layout = B::grouped_layout(m_splits.into_primitive(), tokens).unwrap();
        let context = format!("splits {splits:?} over {tokens} tokens");
        assert_eq!(layout.rows(), reference.rows, "{context}: rows");
        assert_eq!(ints::<B>(layout.row_group.clone()), reference.row_group, "{context}: row groups");
        assert_eq!(ints::<B>(layout.aligned_to_packed.clone()), reference.aligned_to_packed, "{context}: aligned to packed");
        assert_eq!(ints::<B>(layout.packed_to_aligned.clone()), reference.packed_to_aligned, "{context}: packed to aligned");
        let host = layout.groups.host.get().unwrap();
        assert_eq!(host.groups, reference.groups, "{context}: groups");
        assert_eq!(host.status, reference.status, "{context}: status");
        assert_eq!(layout.check().is_ok(), reference.status == SplitStatus::Valid, "{context}: check");
    }
}

/// The bytes of one grouped FP8 per-tensor representation that both twins define: codes (for
/// the columnwise copy, the groups' blocks; its tail is never written), `scale_inv` and amax.
fn fp8_storage_bytes<B: LowpBackend>(q: &QuantizedTensor<B>, direction: Direction, defined: usize) -> (Vec<u8>, Vec<u8>, Vec<u8>, bool) {
    let storage = match direction {
        Direction::Rowwise => q.rowwise.as_ref(),
        Direction::Columnwise => q.columnwise.as_ref(),
    };
    let Some(Storage::Quantized(s)) = storage else { panic!("{direction:?}: no quantized storage") };
    let StorageScales::TensorScaleInv(scales) = &s.scales else { panic!("{direction:?}: not per-tensor scales") };
    let mut codes = B::bytes_to_host(&s.codes);
    if direction == Direction::Columnwise {
        codes.truncate(defined);
    }
    let amax = B::bytes_to_host(s.amax.as_ref().expect("FP8 per-tensor keeps its amax"));
    (codes, B::bytes_to_host(scales), amax, s.shared_scale)
}

/// `grouped_quantize_fp8_padded` (CubeBackend: the amax and cast kernels read the packed tokens
/// through the layout's row map) equals its unfused twin, padding with `grouped_gather_rows` and
/// then quantizing, bit for bit: codes of both directions, scales and amaxes, for current and
/// delayed scaling, per-group and shared scales, E4M3 and E5M2, every dtype given; splits with
/// empty groups and a column count that leaves partial tiles.
pub fn check_padded_fp8_quantize_matches_pad_then_quantize<B: LowpBackend>(device: &B::Device, dtypes: &[InputDtype]) {
    use burn_lowp::backend::grouped::quantize_fp8_padded_after_move;
    use burn_lowp::backend::GroupedFp8Scaling;
    let cols = 400;
    let mut cases = 0;
    for (splits, tokens) in [(vec![0i32, 200, 37, 63], 300usize), (vec![1, 1, 0, 128, 129, 0], 259)] {
        let host = group_layout(&splits, tokens);
        let defined = host.groups.iter().map(|g| g.start + g.len).max().unwrap_or(0) * cols;
        let m_splits = burn::tensor::Tensor::<B, 1, burn::tensor::Int>::from_data(
            burn::tensor::TensorData::new(splits.iter().map(|&v| v as i64).collect::<Vec<_>>(), [splits.len()]),
            device,
        );
        let layout = B::grouped_layout(m_splits.into_primitive(), tokens).unwrap();
        let groups = splits.len();
        let scales: Vec<f32> = (0..groups).map(|g| [0.5f32, 3.0, 2.0f32.powi(-9), 100.0][g % 4]).collect();
        for &dtype in dtypes {
            let x = input(tokens, cols, dtype, 29);
            for fp8 in [Fp8Format::E4M3, Fp8Format::E5M2] {
                let scalings = |pow2: bool| {
                    vec![
                        GroupedFp8Scaling::Current(Fp8CurrentScaling { pow2_scales: pow2, ..Fp8CurrentScaling::new(fp8) }),
                        GroupedFp8Scaling::Delayed {
                            fp8,
                            scales: scale_state::<B>(&scales, 2, 3, device),
                            record: None,
                        },
                    ]
                };
                for scaling in scalings(fp8 == Fp8Format::E5M2) {
                    for group_scaling in [GroupScaling::PerGroup, GroupScaling::Shared] {
                        for usage in [Usage::BOTH, Usage::ROWWISE] {
                            let context = format!("splits {splits:?}, {} {fp8:?} {scaling:?} {group_scaling:?} {usage:?}", dtype.name());
                            let fused = B::grouped_quantize_fp8_padded(B::bytes_float_from_host(&x, device), &layout, scaling.clone(), usage, group_scaling)
                                .unwrap_or_else(|e| panic!("{context}: {e}"));
                            let twin = quantize_fp8_padded_after_move(B::bytes_float_from_host(&x, device), &layout, scaling.clone(), usage, group_scaling)
                                .unwrap_or_else(|e| panic!("{context}: twin: {e}"));
                            assert_eq!((fused.rows, fused.cols), (layout.rows(), cols), "{context}: shape");
                            for direction in [Direction::Rowwise, Direction::Columnwise] {
                                if direction == Direction::Columnwise && !usage.columnwise {
                                    assert!(fused.columnwise.is_none(), "{context}: a columnwise copy nobody asked for");
                                    continue;
                                }
                                let (a, b) = (fp8_storage_bytes(&fused, direction, defined), fp8_storage_bytes(&twin, direction, defined));
                                assert!(a.0 == b.0, "{context} {direction:?}: codes differ");
                                assert_eq!(a.1, b.1, "{context} {direction:?}: scale_inv");
                                assert_eq!(a.2, b.2, "{context} {direction:?}: amax");
                                assert_eq!(a.3, b.3, "{context} {direction:?}: shared-scale mark");
                                cases += 1;
                            }
                        }
                    }
                }
            }
        }
    }
    // A batch that is not the layout's packed tokens is an error, not a read past the end.
    let (splits, tokens) = (vec![100i32, 28], 128usize);
    let m_splits = burn::tensor::Tensor::<B, 1, burn::tensor::Int>::from_data(
        burn::tensor::TensorData::new(splits.iter().map(|&v| v as i64).collect::<Vec<_>>(), [splits.len()]),
        device,
    );
    let layout = B::grouped_layout(m_splits.into_primitive(), tokens).unwrap();
    let wrong = B::bytes_float_from_host(&input(tokens + 16, 64, InputDtype::F32, 3), device);
    let e = B::grouped_quantize_fp8_padded(
        wrong,
        &layout,
        GroupedFp8Scaling::Current(Fp8CurrentScaling::new(Fp8Format::E4M3)),
        Usage::BOTH,
        GroupScaling::PerGroup,
    )
    .expect_err("a batch of 144 rows for a layout of 128 tokens");
    assert!(e.to_string().contains("packed input") && e.to_string().contains("144"), "{e}");
    println!("{cases} padded FP8 quantizations bit-exact against pad-then-quantize");
}

/// `grouped_dbias_amax`: each group's column sums (f32, against f64 sums of the same values
/// within 1e-5 of the column's absolute sum: f32 accumulation in another order) and, where the
/// backend takes them (CubeBackend), each group's amax, exact; packed rows read through the
/// layout's row map give the same bits as the padded batch; and current scaling on those amaxes
/// (`GroupedFp8Scaling::CurrentFromAmax`) quantizes exactly as with its own amax pass.
pub fn check_grouped_dbias_amax_matches_reference<B: LowpBackend>(device: &B::Device, dtypes: &[InputDtype]) {
    use burn_lowp::backend::grouped::quantize_fp8_padded_after_move;
    use burn_lowp::backend::{GroupedFp8Scaling, InputRows};
    // (A partial last cube of column pairs; FP8 needs K divisible by 16.)
    let cols = 1040;
    for (splits, tokens) in [(vec![0i32, 200, 37, 63], 300usize), (vec![1, 1, 0, 128, 129, 0], 259)] {
        let host = group_layout(&splits, tokens);
        let m_splits = burn::tensor::Tensor::<B, 1, burn::tensor::Int>::from_data(
            burn::tensor::TensorData::new(splits.iter().map(|&v| v as i64).collect::<Vec<_>>(), [splits.len()]),
            device,
        );
        let layout = B::grouped_layout(m_splits.into_primitive(), tokens).unwrap();
        for &dtype in dtypes {
            let context = format!("splits {splits:?}, {}", dtype.name());
            let mut dy = input(tokens, cols, dtype, 31);
            dy.values[7] = f32::NAN; // skipped by the amax, carried by the sum
            let packed = || B::bytes_float_from_host(&dy, device);
            let aligned = B::grouped_gather_rows(packed(), layout.aligned_to_packed.clone());
            let (sums_p, amax_p) = B::grouped_dbias_amax(packed(), InputRows::Packed, &layout, true).unwrap();
            let (sums_a, amax_a) = B::grouped_dbias_amax(aligned, InputRows::Aligned, &layout, true).unwrap();
            let floats = |t| {
                burn::tensor::Tensor::<B, 2>::from_primitive(burn::tensor::TensorPrimitive::Float(t))
                    .into_data()
                    .convert::<f32>()
                    .into_vec::<f32>()
                    .unwrap()
            };
            let (sums_p, sums_a) = (floats(sums_p), floats(sums_a));
            assert_eq!(sums_p.len(), splits.len() * cols, "{context}: [groups, cols]");
            assert!(sums_p.iter().zip(&sums_a).all(|(p, a)| p.to_bits() == a.to_bits()), "{context}: packed and aligned sums differ");
            let mut first = 0usize;
            for (g, &n) in splits.iter().enumerate() {
                let rows = first..first + n as usize;
                for c in 0..cols {
                    let column = rows.clone().map(|r| dy.values[r * cols + c] as f64);
                    let (sum, abs) = column.fold((0.0f64, 0.0f64), |(s, a), v| (s + v, a + v.abs()));
                    let got = sums_p[g * cols + c] as f64;
                    if sum.is_nan() {
                        assert!(got.is_nan(), "{context}: group {g} column {c}: NaN expected, got {got}");
                    } else {
                        assert!((got - sum).abs() <= 1e-5 * abs, "{context}: group {g} column {c}: {got} against {sum}");
                    }
                }
                if let Some(amax) = &amax_p {
                    let amax = B::bytes_to_host(amax);
                    let got = f32::from_le_bytes(amax[4 * g..4 * g + 4].try_into().unwrap());
                    let want = burn_lowp::format::scaling::amax(&dy.values[rows.start * cols..rows.end * cols]);
                    assert_eq!(got.to_bits(), want.to_bits(), "{context}: group {g} amax");
                }
                first += n as usize;
            }
            assert_eq!(amax_p.is_some(), amax_a.is_some(), "{context}: amax taken in one read");
            if let Some(amax) = amax_p {
                assert_eq!(B::bytes_to_host(&amax), B::bytes_to_host(&amax_a.unwrap()), "{context}: packed and aligned amaxes");
                let config = Fp8CurrentScaling::new(Fp8Format::E4M3);
                for group_scaling in [GroupScaling::PerGroup, GroupScaling::Shared] {
                    let fused = B::grouped_quantize_fp8_padded(packed(), &layout,
                        GroupedFp8Scaling::CurrentFromAmax { config, amax: amax.clone() }, Usage::BOTH, group_scaling).unwrap();
                    let twin = quantize_fp8_padded_after_move(packed(), &layout, GroupedFp8Scaling::Current(config), Usage::BOTH, group_scaling).unwrap();
                    let defined = host.groups.iter().map(|g| g.start + g.len).max().unwrap_or(0) * cols;
                    for direction in [Direction::Rowwise, Direction::Columnwise] {
                        assert_eq!(fp8_storage_bytes(&fused, direction, defined), fp8_storage_bytes(&twin, direction, defined),
                            "{context}: {group_scaling:?} {direction:?}: quantized on the taken amaxes");
                    }
                }
            }
        }
    }
    println!("grouped dbias and amaxes match the reference");
}

/// `grouped_gather_rows` picks the indexed rows and zero rows for indices past the end, exactly (a
/// copy), for every dtype given; rows of a whole number of 32-bit words take the row-gather kernel
/// on CubeBackend (of 16-byte vectors where they are whole vectors), odd f16 rows Burn's `select`.
pub fn check_gather_rows_matches_reference<B: LowpBackend>(device: &B::Device, dtypes: &[InputDtype]) {
    let rows = 37;
    let index: Vec<i64> = vec![5, 0, 36, 37, 5, 40, 12, 37, 1, 36, 200];
    for &dtype in dtypes {
        // 64 columns: whole 16-byte vectors (the vector kernel); 6: whole words in bf16 and f16
        // (the word kernel) but not in f32's 24 bytes; 3: f16's odd rows take Burn's `select`.
        for cols in [64, 6, 3] {
            let t = input(rows, cols, dtype, 11);
            let got = B::grouped_gather_rows(
                B::bytes_float_from_host(&t, device),
                burn::tensor::Tensor::<B, 1, burn::tensor::Int>::from_data(
                    burn::tensor::TensorData::new(index.clone(), [index.len()]),
                    device,
                )
                .into_primitive(),
            );
            let got = burn::tensor::Tensor::<B, 2>::from_primitive(burn::tensor::TensorPrimitive::Float(got));
            assert_eq!(got.dims(), [index.len(), cols], "{dtype:?} cols {cols}: shape");
            let got: Vec<f32> = got.into_data().convert::<f32>().into_vec::<f32>().unwrap();
            let want: Vec<f32> = index
                .iter()
                .flat_map(|&i| {
                    let i = i as usize;
                    (0..cols).map(move |c| (i, c))
                })
                .map(|(i, c)| if i < rows { t.values[i * cols + c] } else { 0.0 })
                .collect();
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&got), bits(&want), "{dtype:?} cols {cols}");
        }
    }
}

/// `grouped_epilogue` scales group g's rows by `scale_a[g] * scale_b[g]` (rounded to the dtype,
/// rows of no group by 0), adds bias row `g` to them and a zero bias to padding and tail rows (-0
/// becomes +0), the sum rounded once to the dtype (nearest even), and, gathered, gives y row
/// `index[r]`'s result as row r: bit for bit against the host, for every combination.
pub fn check_group_epilogue_matches_reference<B: LowpBackend>(device: &B::Device, dtypes: &[InputDtype]) {
    use burn_lowp::backend::GroupEpilogue;
    let (rows, groups) = (37, 3);
    let row_group: Vec<i64> = (0..rows as i64).map(|r| [0, 1, 3, 2, 2, 9, 1][r as usize % 7]).collect();
    let (scale_a, scale_b) = ([0.5f32, 3.0, 2.0f32.powi(-9)], [1.25f32, 7.0, 96.0]);
    let index: Vec<i64> = vec![36, 0, 5, 5, 12, 1, 30];
    let ints = |v: &[i64]| {
        burn::tensor::Tensor::<B, 1, burn::tensor::Int>::from_data(burn::tensor::TensorData::new(v.to_vec(), [v.len()]), device)
            .into_primitive()
    };
    let f32s = |v: &[f32]| {
        let m = B::bytes_float_from_host(&HostMatrix::new("scales", 1, v.len(), InputDtype::F32, v.to_vec()).unwrap(), device);
        B::float_reshape(m, burn::tensor::Shape::new([v.len()]))
    };
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    let mut cases = 0;
    for &dtype in dtypes {
        for cols in [64, 3] {
            if cols % 2 == 1 && dtype != InputDtype::F32 {
                continue;
            }
            let y = input(rows, cols, dtype, 21);
            let bias = input(groups, cols, dtype, 22);
            for (with_bias, with_scales, gathered) in
                [(true, false, false), (true, false, true), (false, true, false), (true, true, false), (true, true, true), (false, true, true)]
            {
                let epilogue = GroupEpilogue {
                    bias: with_bias.then(|| B::bytes_float_from_host(&bias, device)),
                    scales: with_scales.then(|| (f32s(&scale_a), f32s(&scale_b))),
                    gather: gathered.then(|| ints(&index)),
                };
                let got = B::grouped_epilogue(B::bytes_float_from_host(&y, device), ints(&row_group), epilogue);
                let got = burn::tensor::Tensor::<B, 2>::from_primitive(burn::tensor::TensorPrimitive::Float(got));
                let out_rows = if gathered { index.len() } else { rows };
                let context = format!("{dtype:?} cols {cols}, bias {with_bias}, scales {with_scales}, gathered {gathered}");
                assert_eq!(got.dims(), [out_rows, cols], "{context}: shape");
                let got: Vec<f32> = got.into_data().convert::<f32>().into_vec::<f32>().unwrap();
                let row_of = |r: usize| if gathered { index[r] as usize } else { r };
                let want: Vec<f32> = (0..out_rows * cols)
                    .map(|i| {
                        let (r, c) = (row_of(i / cols), i % cols);
                        let g = row_group[r] as usize;
                        let mut v = y.values[r * cols + c];
                        if with_scales {
                            let factor = if g < groups { scale_a[g] * scale_b[g] } else { 0.0 };
                            v = dtype.round(v * factor);
                        }
                        if with_bias {
                            v = if g < groups { dtype.round(v + bias.values[g * cols + c]) } else { v + 0.0 };
                        }
                        v
                    })
                    .collect();
                assert_eq!(bits(&got), bits(&want), "{context}");
                cases += 1;
            }
        }
    }
    println!("{cases} group epilogues bit-exact");
}

/// Grouped quantization equals quantizing each group's slice on its own (seed `seed + g` for
/// stochastic rounding), bit for bit, for every format and dtype; delayed scaling too, with a
/// different scale per group.
pub fn check_grouped_quantize_matches_per_slice<B: LowpBackend>(device: &B::Device, dtypes: &[InputDtype]) {
    let (splits, tokens) = (vec![0, 200, 37, 63], 300);
    let cols = 128;
    let mut cases = 0;
    for &dtype in dtypes {
        let (x, groups) = grouped_input(&splits, tokens, cols, dtype, 17);
        let device_groups = Groups::<B>::from_host(groups.clone(), x.rows, device).unwrap();
        for (name, config) in configs() {
            // NVFP4's kernels differ by direction (a rowwise-only grouped cast takes the strip
            // kernel without its columnwise half): every direction for it, both for the rest.
            let usages: &[Usage] = if matches!(config, FormatConfig::Nvfp4(_)) {
                &[Usage::BOTH, Usage::ROWWISE, Usage::COLUMNWISE]
            } else {
                &[Usage::BOTH]
            };
            for &usage in usages {
                let q = B::grouped_quantize(B::bytes_float_from_host(&x, device), &device_groups, &config, usage, GroupScaling::PerGroup)
                    .unwrap_or_else(|e| panic!("{name}: {e}"));
                for (g, group) in groups.iter().enumerate() {
                    if group.len == 0 {
                        continue;
                    }
                    let slice = HostMatrix::new("slice", group.len, cols, dtype,
                        x.values[group.start * cols..(group.start + group.len) * cols].to_vec()).unwrap();
                    let reference = quantize(&slice, &group_config(&config, g), usage).unwrap();
                    let ours = group_view(&q, g, *group).to_host().unwrap();
                    assert_bit_equal(&ours, &reference, &format!("grouped {name} {} group {g} {usage:?}", dtype.name()));
                    cases += 1;
                }
            }
        }
        for fp8 in [Fp8Format::E4M3, Fp8Format::E5M2] {
            let scales = [0.5f32, 3.0, 2.0f32.powi(-9), 100.0];
            // Read in place at columns 1 + 2g of a module's scales.
            let q = B::grouped_quantize_fp8_with_scale(B::bytes_float_from_host(&x, device), fp8, scale_state::<B>(&scales, 1, 2, device),
                &device_groups, Usage::BOTH, GroupScaling::PerGroup, None).unwrap();
            for (g, group) in groups.iter().enumerate().filter(|(_, g)| g.len > 0) {
                let slice = HostMatrix::new("slice", group.len, cols, dtype,
                    x.values[group.start * cols..(group.start + group.len) * cols].to_vec()).unwrap();
                let reference = quantize_fp8_with_scale(&slice, fp8, scales[g], Usage::BOTH).unwrap();
                let ours = group_view(&q, g, *group).to_host().unwrap();
                assert_bit_equal(&ours, &reference, &format!("grouped delayed {fp8:?} {} group {g}", dtype.name()));
                cases += 1;
            }
        }
    }
    println!("{cases} grouped quantize groups bit-exact against their slices");
}

/// `GroupScaling::Shared`: every group of a grouped FP8 per-tensor quantization equals its slice
/// quantized with the one shared scale, bit for bit: the scale of the largest group amax (current
/// scaling, amax taken here on the host) or the smallest given scale (delayed); each group keeps
/// its own amax, every group's `scale_inv` (empty groups too) is the shared one, and the storages
/// say so.
pub fn check_grouped_shared_scale_matches_per_slice<B: LowpBackend>(device: &B::Device, dtypes: &[InputDtype]) {
    // Group 1 holds the largest values, group 2 far smaller ones (its own scale would differ).
    let (splits, tokens) = (vec![0, 200, 37, 63], 300);
    let cols = 128;
    let mut cases = 0;
    for &dtype in dtypes {
        let (mut x, groups) = grouped_input(&splits, tokens, cols, dtype, 23);
        for v in &mut x.values[groups[2].start * cols..(groups[2].start + groups[2].len) * cols] {
            *v = dtype.round(*v * 2.0f32.powi(-6));
        }
        let device_groups = Groups::<B>::from_host(groups.clone(), x.rows, device).unwrap();
        let slice = |g: &RowGroup| {
            HostMatrix::new("slice", g.len, cols, dtype, x.values[g.start * cols..(g.start + g.len) * cols].to_vec()).unwrap()
        };
        let amaxes: Vec<f32> = groups.iter().map(|g| burn_lowp::format::scaling::amax(&slice(g).values)).collect();
        let largest = amaxes.iter().cloned().fold(0.0f32, f32::max);
        let mut checked = |q: QuantizedTensor<B>, fp8: Fp8Format, scale: f32, what: &str| {
            for side in [&q.rowwise, &q.columnwise] {
                let Some(Storage::Quantized(s)) = side else {
                    panic!("{what}: a quantized storage per direction");
                };
                assert!(s.shared_scale, "{what}: storage not marked shared");
                let StorageScales::TensorScaleInv(bytes) = &s.scales else {
                    panic!("{what}: FP8 per-tensor scales");
                };
                for (g, word) in B::bytes_to_host(bytes).chunks_exact(4).enumerate() {
                    let got = f32::from_le_bytes([word[0], word[1], word[2], word[3]]);
                    assert_eq!(got.to_bits(), (1.0f32 / scale).to_bits(), "{what}: group {g}'s scale_inv (empty ones too)");
                }
            }
            for (g, group) in groups.iter().enumerate() {
                if group.len == 0 {
                    continue;
                }
                let view = group_view(&q, g, *group);
                let reference = quantize_fp8_with_scale(&slice(group), fp8, scale, Usage::BOTH).unwrap();
                let ours = view.to_host().unwrap();
                assert_bit_equal(&ours, &reference, &format!("{what} {} group {g}", dtype.name()));
                cases += 1;
            }
        };
        for fp8 in [Fp8Format::E4M3, Fp8Format::E5M2] {
            let current = Fp8CurrentScaling::new(fp8);
            let q = B::grouped_quantize(B::bytes_float_from_host(&x, device), &device_groups,
                &FormatConfig::Fp8Current(current), Usage::BOTH, GroupScaling::Shared).unwrap();
            checked(q, fp8, current.scale_for(largest), &format!("shared current {fp8:?}"));
            let scales = [0.5f32, 3.0, 2.0f32.powi(-9), 100.0];
            // The smallest of columns 1 + 2g, not of the decoys between them.
            let q = B::grouped_quantize_fp8_with_scale(B::bytes_float_from_host(&x, device), fp8, scale_state::<B>(&scales, 1, 2, device),
                &device_groups, Usage::BOTH, GroupScaling::Shared, None).unwrap();
            checked(q, fp8, 2.0f32.powi(-9), &format!("shared delayed {fp8:?}"));
        }
        // Per-group scales differ for these groups, so sharing is visible.
        let current = Fp8CurrentScaling::new(Fp8Format::E4M3);
        assert_ne!(current.scale_for(amaxes[2]), current.scale_for(largest), "the test's groups need different own scales");
    }
    println!("{cases} shared-scale grouped quantize groups bit-exact against their slices");
}
