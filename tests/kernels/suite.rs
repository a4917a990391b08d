//! The kernel test suite, written once and instantiated per backend by `kernel_suite!`.
#![allow(dead_code)]

use burn_lowp::backend::grouped::group_view;
use burn_lowp::backend::{Groups, LowpBackend, RowGroup, ScaleColumns};
use burn_lowp::format::grouped::{group_config, group_layout, GroupScaling, SplitStatus};
use burn_lowp::quant::{QuantizedTensor, Storage, StorageScales};
use burn_lowp::format::fp8_block::BlockShape;
use burn_lowp::format::{
    quantize, quantize_fp8_with_scale, Direction, FormatConfig, Fp8BlockScaling, Fp8CurrentScaling,
    Fp8Format, HostMatrix, HostQuantized, InputDtype, Mxfp8Config, Nvfp4Config, QuantizedData,
    Scales, Usage,
};

use crate::common::{read_f32, SplitMix};

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
    burn_lowp_kernels::force_tile_quantize_kernels(true);
    let cases = quantize_cases_match_reference::<B>(device, dtypes, |config| {
        matches!(
            config,
            FormatConfig::Mxfp8(_) | FormatConfig::Fp8Block(_) | FormatConfig::Nvfp4(_)
        )
    });
    burn_lowp_kernels::force_tile_quantize_kernels(false);
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

/// Delayed-scaling scales as a module's state holds them: `scales[g]` at column `first + g *
/// stride` of a 1-D f32 tensor whose other columns hold a decoy (2^-24: smaller than any scale
/// the tests give, so a cast reading a wrong column, or a shared scale taken over one, is seen).
fn scale_state<B: LowpBackend>(scales: &[f32], first: usize, stride: usize, device: &B::Device) -> ScaleColumns<B> {
    let width = first + scales.len().saturating_sub(1) * stride + 2;
    let mut state = vec![2.0f32.powi(-24); width];
    for (g, &v) in scales.iter().enumerate() {
        state[first + g * stride] = v;
    }
    ScaleColumns { scales: f32_tensor::<B>(state, 1, width, device), first, stride }
}

/// An f32 `[rows, cols]` tensor of backend `B` from host values.
fn f32_tensor<B: LowpBackend>(values: Vec<f32>, rows: usize, cols: usize, device: &B::Device) -> burn::tensor::ops::FloatTensor<B> {
    B::bytes_float_from_host(&HostMatrix::new("f32", rows, cols, InputDtype::F32, values).unwrap(), device)
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
/// on CubeBackend, odd f16 rows Burn's `select`.
pub fn check_gather_rows_matches_reference<B: LowpBackend>(device: &B::Device, dtypes: &[InputDtype]) {
    let rows = 37;
    let index: Vec<i64> = vec![5, 0, 36, 37, 5, 40, 12, 37, 1, 36, 200];
    for &dtype in dtypes {
        for cols in [64, 3] {
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

/// Instantiates the suite for `$backend` on `$device` (an `Option`: `None` skips) with `$dtypes`.
macro_rules! kernel_suite {
    ($backend:ty, $device:expr, [$($dtype:expr),*]) => {
        fn dtypes() -> Vec<burn_lowp::format::InputDtype> { vec![$($dtype),*] }

        #[test]
        fn quantize_matches_reference() {
            if let Some(d) = $device { crate::suite::check_quantize_matches_reference::<$backend>(&d, &dtypes()); }
        }
        #[test]
        fn tile_quantize_kernels_match_reference() {
            if let Some(d) = $device { crate::suite::check_tile_quantize_kernels_match_reference::<$backend>(&d, &dtypes()); }
        }

        #[test]
        fn grouped_shared_scale_matches_per_slice() {
            if let Some(d) = $device { crate::suite::check_grouped_shared_scale_matches_per_slice::<$backend>(&d, &dtypes()); }
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
        fn amax_over_many_chunks_per_unit_matches_reference() {
            if let Some(d) = $device { crate::suite::check_amax_over_many_chunks_per_unit::<$backend>(&d, &dtypes()); }
        }

        #[test]
        fn delayed_scaling_matches_reference() {
            if let Some(d) = $device { crate::suite::check_delayed_scaling_matches_reference::<$backend>(&d, &dtypes()); }
        }

        #[test]
        fn delayed_casts_record_into_history() {
            if let Some(d) = $device { crate::suite::check_delayed_casts_record_into_history::<$backend>(&d, &dtypes()); }
        }

        #[test]
        fn dropped_group_layout_leaves_reads_working() {
            if let Some(d) = $device { crate::suite::check_dropped_group_layout_leaves_reads_working::<$backend>(&d); }
        }

        #[test]
        fn delayed_update_matches_tensor_ops() {
            if let Some(d) = $device { crate::suite::check_delayed_update_matches_tensor_ops::<$backend>(&d); }
        }

        #[test]
        fn nvfp4_special_values_match_reference() {
            if let Some(d) = $device { crate::suite::check_nvfp4_special_values_match_reference::<$backend>(&d, &dtypes()); }
        }

        #[test]
        fn fp8_special_values_match_reference() {
            if let Some(d) = $device { crate::suite::check_fp8_special_values_match_reference::<$backend>(&d, &dtypes()); }
        }

        #[test]
        fn golden_inputs_match_reference() {
            if let Some(d) = $device {
                crate::suite::check_goldens::<$backend>(&d, dtypes().contains(&burn_lowp::format::InputDtype::BF16));
            }
        }

        #[test]
        fn group_layout_matches_reference() {
            if let Some(d) = $device { crate::suite::check_group_layout_matches_reference::<$backend>(&d); }
        }

        #[test]
        fn grouped_quantize_matches_per_slice_quantize() {
            if let Some(d) = $device { crate::suite::check_grouped_quantize_matches_per_slice::<$backend>(&d, &dtypes()); }
        }

        #[test]
        fn padded_fp8_quantize_matches_pad_then_quantize() {
            if let Some(d) = $device { crate::suite::check_padded_fp8_quantize_matches_pad_then_quantize::<$backend>(&d, &dtypes()); }
        }

        #[test]
        fn grouped_dbias_amax_matches_reference() {
            if let Some(d) = $device { crate::suite::check_grouped_dbias_amax_matches_reference::<$backend>(&d, &dtypes()); }
        }

        #[test]
        fn gather_rows_matches_reference() {
            let dtypes: Vec<_> = dtypes().into_iter().filter(|d| *d != burn_lowp::format::InputDtype::BF16).collect();
            if let Some(d) = $device { crate::suite::check_gather_rows_matches_reference::<$backend>(&d, &dtypes); }
        }

        #[test]
        fn group_epilogue_matches_reference() {
            let dtypes: Vec<_> = dtypes().into_iter().filter(|d| *d != burn_lowp::format::InputDtype::BF16).collect();
            if let Some(d) = $device { crate::suite::check_group_epilogue_matches_reference::<$backend>(&d, &dtypes); }
        }

        #[test]
        fn bad_shapes_are_errors() {
            if let Some(d) = $device { crate::suite::check_bad_shapes_are_errors::<$backend>(&d); }
        }
    };
}
pub(crate) use kernel_suite;
