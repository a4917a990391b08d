//! Quantized GEMMs against an f64 reference under every format and path, and on CUDA the
//! ordering of cuBLASLt against CubeCL's stream and the GEMM tuning file (`module_suite!` and
//! `modules.rs`'s CUDA tests call these).
#![allow(dead_code)]

use burn::tensor::{Distribution, FloatDType, Shape, Tensor};
use burn_lowp::backend::{GemmCall, GemmKind, GemmOptions, GemmPath, LowpBackend};
use burn_lowp::format::fp8_block::BlockShape;
use burn_lowp::format::{Fp8Format, HostMatrix, Usage};
use burn_lowp::quant::{
    quantize, ColumnwiseSource, IdentityDtype, QuantizeCall, QuantizedTensor, QuantizerSpec,
};

use crate::suite::{f32_tensor, matrix, values, Exactness};

fn f64_matmul(a: &[f64], b: &[f64], m: usize, k: usize, n: usize) -> Vec<f64> {
    let mut out = vec![0.0; m * n];
    for i in 0..m {
        for p in 0..k {
            let av = a[i * k + p];
            for j in 0..n {
                out[i * n + j] += av * b[p * n + j];
            }
        }
    }
    out
}

fn transpose(v: &[f64], rows: usize, cols: usize) -> Vec<f64> {
    let mut out = vec![0.0; v.len()];
    for r in 0..rows {
        for c in 0..cols {
            out[c * rows + r] = v[r * cols + c];
        }
    }
    out
}

/// How far a GEMM result may be from the f64 product of its dequantized operands, as a multiple
/// of `sum |a||b|` for that element (`inner` = contraction length):
/// * f32 arithmetic (NdArray, cuBLASLt FP32): `inner * 2^-24`, the classic summation bound;
/// * cuBLASLt FP8 (per-tensor or block): Hopper's FP8 tensor cores accumulate in a reduced-
///   precision register before promoting to FP32 (fast accumulation keeps it for the whole sum),
///   so we allow 2^-8; a wrong layout or scale is off by O(1);
/// * BF16 emulation: each operand is rounded to BF16 (2^-9 relative each) before the GEMM: 2^-7.
fn tolerance(path: GemmPath, inner: usize) -> f64 {
    match path {
        GemmPath::DequantizeMatmul | GemmPath::CublasLtHighPrecision => {
            inner as f64 * 2f64.powi(-24)
        }
        GemmPath::CublasLtFp8Tensor | GemmPath::CublasLtFp8Block => 2f64.powi(-8),
        GemmPath::EmulatedBf16 => 2f64.powi(-7),
    }
}

/// Compares a BF16-output GEMM's result with `want(i)` within `slack(i, want(i))`; a failed call
/// or elements off go to `failures` under `label`. False when the call failed.
fn check_bf16_output<B: LowpBackend>(
    result: burn_lowp::error::Result<burn::tensor::ops::FloatTensor<B>>,
    want: impl Fn(usize) -> f64,
    slack: impl Fn(usize, f64) -> f64,
    label: &str,
    failures: &mut Vec<String>,
) -> bool {
    let got = match result {
        Ok(t) => crate::common::read_f32::<B>(t),
        Err(e) => {
            failures.push(format!("{label}: {e}"));
            return false;
        }
    };
    let bad = (0..got.len())
        .filter(|&i| (got[i] as f64 - want(i)).abs() > slack(i, want(i)))
        .collect::<Vec<_>>();
    if let Some(&i) = bad.first() {
        failures.push(format!(
            "{label}: {} elements off, e.g. [{i}] {} vs {}",
            bad.len(),
            got[i],
            want(i)
        ));
    }
    true
}

/// Each GEMM kind on quantized operands equals the f64 product of the dequantized operands (up to
/// the path's arithmetic), stays within the format's error bound of the high-precision product,
/// and takes the expected path (cuBLASLt FP8 / block / high precision, or BF16 emulation on CUDA).
/// Also checks BF16 outputs and accumulate-into.
pub fn check_gemms<B: LowpBackend>(device: &B::Device, exactness: Exactness) {
    let (m, n, k) = (128, 256, 384);
    let fp8 = |fp8| QuantizerSpec::Fp8Current {
        fp8,
        pow2_scales: false,
        amax_epsilon: 0.0,
    };
    let block = |block| QuantizerSpec::Fp8Block {
        fp8: Fp8Format::E4M3,
        block,
        pow2_scales: true,
        amax_epsilon: 0.0,
    };
    let mx = QuantizerSpec::Mxfp8 {
        fp8: Fp8Format::E4M3,
        block_2d: false,
    };
    let nv = |block_2d, rht| QuantizerSpec::Nvfp4 {
        block_2d,
        rht,
        stochastic_rounding: false,
    };
    let identity = QuantizerSpec::Identity {
        dtype: IdentityDtype::F32,
    };
    use GemmPath::*;
    // (name, activation/gradient quantizer, weight quantizer, relative Frobenius error bound,
    // path on CUDA for [fprop, dgrad, wgrad]). Bounds: about twice the error each format shows on
    // unit Gaussians (E4M3 ~2.5%, E5M2 ~5%, NVFP4 ~10% per operand).
    let cases: Vec<(&str, QuantizerSpec, QuantizerSpec, f64, [GemmPath; 3])> = vec![
        (
            "identity",
            identity.clone(),
            identity.clone(),
            1e-6,
            [CublasLtHighPrecision; 3],
        ),
        (
            "fp8 e4m3",
            fp8(Fp8Format::E4M3),
            fp8(Fp8Format::E4M3),
            0.06,
            [CublasLtFp8Tensor; 3],
        ),
        // Wgrad multiplies dY by X, both E5M2 here: no FP8 GEMM takes two E5M2 operands.
        (
            "fp8 e5m2 x e4m3",
            fp8(Fp8Format::E5M2),
            fp8(Fp8Format::E4M3),
            0.12,
            [CublasLtFp8Tensor, CublasLtFp8Tensor, EmulatedBf16],
        ),
        (
            "block 1x128 x 128x128",
            block(BlockShape::OneByOneTwentyEight),
            block(BlockShape::OneTwentyEightSquare),
            0.06,
            [CublasLtFp8Block; 3],
        ),
        (
            "mxfp8",
            mx.clone(),
            QuantizerSpec::Mxfp8 {
                fp8: Fp8Format::E4M3,
                block_2d: true,
            },
            0.06,
            [EmulatedBf16; 3],
        ),
        (
            "nvfp4 rht x 2d",
            nv(false, true),
            nv(true, false),
            0.3,
            [EmulatedBf16; 3],
        ),
        (
            "hybrid mxfp8/nvfp4",
            QuantizerSpec::Hybrid {
                rowwise: Box::new(mx.clone()),
                columnwise: Box::new(nv(false, true)),
                columnwise_source: ColumnwiseSource::Original,
            },
            mx.clone(),
            0.3,
            [EmulatedBf16; 3],
        ),
        (
            "fp8 x identity",
            fp8(Fp8Format::E4M3),
            identity.clone(),
            0.06,
            // Wgrad (dY x X) has two FP8 operands; the weight only enters fprop and dgrad.
            [EmulatedBf16, EmulatedBf16, CublasLtFp8Tensor],
        ),
    ];
    let x = matrix(m, k, 1); // X [M, K]
    let w = matrix(n, k, 2); // W [N, K]
    let dy = matrix(m, n, 3); // dY [M, N]
    let call = QuantizeCall::<B>::new(0);
    // Every case runs and every failure is reported at the end (one GPU run shows them all).
    let mut failures: Vec<String> = Vec::new();
    for (name, act, weight, bound, cuda_paths) in cases {
        let q = |h: &HostMatrix, spec: &QuantizerSpec| {
            quantize::<B>(
                B::bytes_float_from_host(h, device),
                spec,
                Usage::BOTH,
                false,
                &call,
            )
            .unwrap()
        };
        let (qx, qw, qdy) = (q(&x, &act), q(&w, &weight), q(&dy, &act));
        let f64s = |v: &[f32]| v.iter().map(|&x| x as f64).collect::<Vec<_>>();
        let deq = |t: &QuantizedTensor<B>, d| match t.require(d).unwrap() {
            burn_lowp::quant::Storage::HighPrecision(h) => {
                f64s(&crate::common::read_f32::<B>(h.clone()))
            }
            _ => f64s(&crate::common::read_f32::<B>(
                B::quantize_dequantize(t, d).unwrap(),
            )),
        };
        for (ki, kind) in [GemmKind::Fprop, GemmKind::Dgrad, GemmKind::Wgrad]
            .into_iter()
            .enumerate()
        {
            let (a, b, a_hp, b_hp, shape) = match kind {
                GemmKind::Fprop => (&qx, &qw, &x, &w, (m, n, k)),
                GemmKind::Dgrad => (&qdy, &qw, &dy, &w, (m, k, n)),
                GemmKind::Wgrad => (&qdy, &qx, &dy, &x, (n, k, m)),
            };
            let path = B::gemm_path(kind, a, b);
            let expected = match exactness {
                Exactness::Reference => DequantizeMatmul,
                Exactness::Gpu => cuda_paths[ki],
            };
            if path != expected {
                failures.push(format!(
                    "{name} {kind:?}: path {path:?}, expected {expected:?}"
                ));
            }
            let got = match B::gemm_quantized(kind, a, b, GemmOptions::default()) {
                Ok(t) => crate::common::read_f32::<B>(t),
                Err(e) => {
                    failures.push(format!("{name} {kind:?} ({path:?}): {e}"));
                    continue;
                }
            };
            let (da, db) = kind.directions();
            // Operand matrices as [rows, contraction] x [contraction, cols] in f64.
            let arrange = |a: Vec<f64>, b: Vec<f64>| match kind {
                GemmKind::Fprop => (a, transpose(&b, n, k)),
                GemmKind::Dgrad => (a, b),
                GemmKind::Wgrad => (transpose(&a, m, n), b),
            };
            let (ad, bd) = arrange(deq(a, da), deq(b, db));
            let (ah, bh) = arrange(f64s(&a_hp.values), f64s(&b_hp.values));
            let (rows, cols, inner) = shape;
            let exact = f64_matmul(&ad, &bd, rows, inner, cols);
            let abs = f64_matmul(
                &ad.iter().map(|v| v.abs()).collect::<Vec<_>>(),
                &bd.iter().map(|v| v.abs()).collect::<Vec<_>>(),
                rows,
                inner,
                cols,
            );
            let truth = f64_matmul(&ah, &bh, rows, inner, cols);
            let relative = tolerance(path, inner);
            let bad = (0..got.len())
                .filter(|&i| (got[i] as f64 - exact[i]).abs() > relative * abs[i] + 1e-30)
                .collect::<Vec<_>>();
            if let Some(&i) = bad.first() {
                failures.push(format!(
                    "{name} {kind:?} ({path:?}): {} of {} elements off, e.g. [{i}] {} vs {}",
                    bad.len(),
                    got.len(),
                    got[i],
                    exact[i]
                ));
            }
            let err: f64 = got
                .iter()
                .zip(&truth)
                .map(|(g, t)| (*g as f64 - t).powi(2))
                .sum::<f64>()
                .sqrt();
            let norm: f64 = truth.iter().map(|t| t * t).sum::<f64>().sqrt();
            if err / norm > bound {
                failures.push(format!(
                    "{name} {kind:?}: relative error {} > {bound}",
                    err / norm
                ));
            }

            // BF16 output with accumulate-into: D = A·B + C, rounded once to BF16.
            let c = matrix(rows, cols, 4 + ki as u64);
            let summed = B::gemm_quantized(
                kind,
                a,
                b,
                GemmOptions {
                    out_dtype: FloatDType::BF16,
                    accumulate: Some(B::bytes_float_from_host(&c, device)),
                    split_accumulator: None,
                    bias: None,
                },
            );
            // BF16 rounding of the result (2^-8 relative) on top of the GEMM's own bound.
            let summed_ok = check_bf16_output::<B>(
                summed,
                |i| exact[i] + c.values[i] as f64,
                |i, want| relative * abs[i] + 2f64.powi(-8) * want.abs() + 1e-30,
                &format!("{name} {kind:?} bf16 + accumulate"),
                &mut failures,
            );
            if !summed_ok {
                continue;
            }

            // BF16 output with a bias added to every row: on CUDA cuBLASLt's epilogue for the
            // BF16, FP8 per-tensor and emulated paths (the sum rounded once), an add after the
            // GEMM for FP8 block scaling and elsewhere (rounded twice: 2^-8 of each, the product
            // and the sum, on top of the GEMM's own bound).
            let bias = matrix(1, cols, 7 + ki as u64);
            let bias_tensor = B::float_reshape(B::bytes_float_from_host(&bias, device), Shape::new([cols]));
            let biased = B::gemm_quantized(
                kind,
                a,
                b,
                GemmOptions {
                    out_dtype: FloatDType::BF16,
                    accumulate: None,
                    split_accumulator: None,
                    bias: Some(bias_tensor),
                },
            );
            check_bf16_output::<B>(
                biased,
                |i| exact[i] + bias.values[i % cols] as f64,
                |i, want| relative * abs[i] + 2f64.powi(-8) * (exact[i].abs() + want.abs()) + 1e-30,
                &format!("{name} {kind:?} bf16 + bias"),
                &mut failures,
            );
        }
        // A backward's dgrad and wgrad as one group (on CUDA: one handshake, two streams, the
        // BF16 output's cast queued after the group) equal the same GEMMs called one by one.
        let group = B::gemm_group(vec![
            GemmCall {
                kind: GemmKind::Dgrad,
                a: &qdy,
                b: &qw,
                options: GemmOptions::default(),
            },
            GemmCall {
                kind: GemmKind::Wgrad,
                a: &qdy,
                b: &qx,
                options: GemmOptions {
                    out_dtype: FloatDType::BF16,
                    accumulate: None,
                    split_accumulator: None,
                    bias: None,
                },
            },
        ]);
        let alone = [
            B::gemm_quantized(GemmKind::Dgrad, &qdy, &qw, GemmOptions::default()),
            B::gemm_quantized(
                GemmKind::Wgrad,
                &qdy,
                &qx,
                GemmOptions {
                    out_dtype: FloatDType::BF16,
                    accumulate: None,
                    split_accumulator: None,
                    bias: None,
                },
            ),
        ];
        match (group, alone) {
            (Ok(group), [Ok(dx), Ok(dw)]) if group.len() == 2 => {
                for (what, got, want) in group
                    .into_iter()
                    .zip([dx, dw])
                    .zip(["dgrad", "wgrad"])
                    .map(|((g, w), what)| {
                        (
                            what,
                            crate::common::read_f32::<B>(g),
                            crate::common::read_f32::<B>(w),
                        )
                    })
                {
                    let differ = got
                        .iter()
                        .zip(&want)
                        .filter(|(g, w)| g.to_bits() != w.to_bits())
                        .count();
                    if differ > 0 || got.len() != want.len() {
                        failures.push(format!("{name} grouped {what}: {differ} of {} values differ from the GEMM alone", want.len()));
                    }
                }
            }
            (group, alone) => failures.push(format!(
                "{name} grouped dgrad + wgrad: {:?} outputs, alone {:?}",
                group.map(|g| g.len()).map_err(|e| e.to_string()),
                alone.iter().map(|r| r.is_ok()).collect::<Vec<_>>()
            )),
        }
    }
    assert!(
        failures.is_empty(),
        "GEMM failures:\n{}",
        failures.join("\n")
    );
}

/// CUDA only: a chain of GEMMs whose operands CubeCL produces right before each GEMM (scale,
/// quantize) and whose outputs CubeCL consumes right after (accumulate), in fresh buffers each
/// time, gives bit-identical results on CubeCL's stream, with device-flag ordering and with host
/// synchronization, and no wait kernel gives up.
#[cfg(feature = "cuda")]
pub fn check_stream_ordering<B: LowpBackend>(device: &B::Device)
where
    B::Device: 'static,
{
    use burn_lowp::backend::cuda::cublaslt::{set_stream_ordering, stream_ordering, StreamOrdering};
    let (m, n, k) = (1024, 768, 2048);
    let x = Tensor::<B, 2>::random([m, k], Distribution::Normal(0.0, 1.0), device);
    let w = Tensor::<B, 2>::random([n, k], Distribution::Normal(0.0, 1.0), device);
    let specs = [
        QuantizerSpec::Fp8Current {
            fp8: Fp8Format::E4M3,
            pow2_scales: false,
            amax_epsilon: 0.0,
        },
        QuantizerSpec::Identity {
            dtype: IdentityDtype::F32,
        },
    ];
    let call = QuantizeCall::<B>::new(0);
    let run = |ordering: StreamOrdering, spec: &QuantizerSpec| {
        set_stream_ordering(ordering);
        let qw = quantize::<B>(
            w.clone().into_primitive().tensor(),
            spec,
            Usage::ROWWISE,
            false,
            &call,
        )
        .unwrap();
        let mut sum = Tensor::<B, 2>::zeros([m, n], device);
        for i in 0..24 {
            let xi = x.clone() * (1.0 + i as f32 / 8.0);
            let qx = quantize::<B>(
                xi.into_primitive().tensor(),
                spec,
                Usage::ROWWISE,
                false,
                &call,
            )
            .unwrap();
            let y: Tensor<B, 2> = f32_tensor(
                B::gemm_quantized(GemmKind::Fprop, &qx, &qw, GemmOptions::default()).unwrap(),
            );
            sum = sum * 0.5 + y;
        }
        values(sum)
    };
    let before = stream_ordering();
    for spec in &specs {
        let synced = run(StreamOrdering::HostSync, spec);
        let non_finite = |v: &[f32]| v.iter().filter(|x| !x.is_finite()).count();
        assert_eq!(non_finite(&synced), 0, "{spec:?}: host-synchronized: first values {:?}", &synced[..4]);
        for ordering in [StreamOrdering::DeviceFlags, StreamOrdering::CubeclStream] {
            let ordered = run(ordering, spec);
            assert_eq!(
                stream_ordering(),
                ordering,
                "{spec:?}: {ordering:?} failed and fell back to host synchronization"
            );
            assert_eq!(
                non_finite(&ordered),
                0,
                "{spec:?}: {ordering:?}: non-finite values; first values {:?}",
                &ordered[..4]
            );
            let differ = synced.iter().zip(&ordered).filter(|(a, b)| a != b).count();
            assert_eq!(
                differ,
                0,
                "{spec:?}: {ordering:?} changed {differ} of {} results",
                synced.len()
            );
        }
    }
    set_stream_ordering(before);
    let cuda_device = (device as &dyn std::any::Any)
        .downcast_ref::<burn_lowp_kernels::cubecl::cuda::CudaDevice>()
        .expect("a CUDA device");
    let client = <burn_lowp_kernels::cubecl::cuda::CudaRuntime as burn_lowp_kernels::cubecl::Runtime>::client(cuda_device);
    assert_eq!(
        burn_lowp::backend::cuda::cublaslt::timed_out_gemm(&client, cuda_device.index).unwrap(),
        0,
        "a wait kernel gave up"
    );
}

/// GEMM tuning (CUDA): a shape's first GEMM times the candidate algorithms (one autotune); with
/// the plans dropped (`reset_plans`) and the tuning file that run saved loaded, the same GEMM
/// takes the file's algorithm without timing and gives the same bits.
pub fn check_gemm_tuning_file_reuses_algorithms<B: LowpBackend>(device: &B::Device, reset_plans: impl Fn()) {
    use burn_lowp::backend::{host_syncs, load_gemm_tuning, save_gemm_tuning};
    // A shape no other test uses, FP8 (whose candidates differ most) and BF16.
    let (m, n, k) = (1152, 896, 1664);
    let x = Tensor::<B, 2>::random([m, k], Distribution::Normal(0.0, 1.0), device);
    let w = Tensor::<B, 2>::random([n, k], Distribution::Normal(0.0, 1.0), device);
    let call = QuantizeCall::<B>::new(0);
    let specs = [
        QuantizerSpec::Fp8Current {
            fp8: Fp8Format::E4M3,
            pow2_scales: false,
            amax_epsilon: 0.0,
        },
        QuantizerSpec::Identity {
            dtype: IdentityDtype::Bf16,
        },
    ];
    let gemms = || -> Vec<Vec<f32>> {
        specs
            .iter()
            .map(|spec| {
                let q = |t: &Tensor<B, 2>| {
                    quantize::<B>(t.clone().into_primitive().tensor(), spec, Usage::ROWWISE, false, &call).unwrap()
                };
                values(f32_tensor::<B, 2>(
                    B::gemm_quantized(GemmKind::Fprop, &q(&x), &q(&w), GemmOptions::default()).unwrap(),
                ))
            })
            .collect()
    };
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("gemm-tuning.json");
    let before = host_syncs();
    let timed = gemms();
    assert_eq!(host_syncs().since(&before).gemm_autotunes, 2, "each new shape is timed once");
    assert!(save_gemm_tuning(&file).unwrap() >= 2);
    reset_plans();
    assert!(load_gemm_tuning(&file).unwrap() >= 2);
    let before = host_syncs();
    let from_file = gemms();
    assert_eq!(host_syncs().since(&before).gemm_autotunes, 0, "the file's algorithms are not timed again");
    for (spec, (a, b)) in specs.iter().zip(timed.iter().zip(&from_file)) {
        assert!(a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits()), "{spec:?}: other bits with the file's algorithm");
    }
}
