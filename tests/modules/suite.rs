//! The module test suite, written once and instantiated per backend by `module_suite!`.
#![allow(dead_code)]

use burn::backend::Autodiff;
use burn::module::Module;
use burn::optim::{AdamConfig, GradientsParams, Optimizer};
use burn::tensor::backend::Backend;
use burn::tensor::{Distribution, ElementConversion, FloatDType, Shape, Tensor, TensorPrimitive};
use burn_lowp::backend::{GemmCall, GemmKind, GemmOptions, GemmPath, LowpBackend};
use burn_lowp::format::fp8_block::BlockShape;
use burn_lowp::format::{Fp8Format, HostMatrix, InputDtype, Usage};
use burn_lowp::nn::{LayerNormLinear, LayerNormLinearConfig, Linear, LinearConfig, Normalization};
use burn_lowp::quant::{
    quantize, ColumnwiseSource, IdentityDtype, QuantizeCall, QuantizedTensor, QuantizerSpec,
};
use burn_lowp::recipe::Recipe;

/// What a backend's results are compared with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exactness {
    /// NdArray: the f32 reference path. The identity recipe equals plain Burn bit for bit.
    Reference,
    /// CUDA: cuBLASLt GEMMs, whose summation order differs from Burn's matmul, which may itself
    /// use TF32 tensor cores, and the `bf16` recipe really rounds operands to BF16 there (RMS
    /// relative error of a product about 1.6e-3); identity results are compared within 8e-3
    /// relative (Frobenius) error.
    Gpu,
}

pub fn recipe(name: &str) -> Recipe {
    Recipe::load(crate::common::recipes_dir().join(name)).unwrap()
}

pub const RECIPES: [&str; 8] = [
    "bf16.json",
    "delayed_scaling.json",
    "current_scaling.json",
    "block_scaling.json",
    "mxfp8.json",
    "nvfp4.json",
    "mxfp8_fwd_nvfp4_bwd.json",
    "nvfp4_keep_first_last_bf16.json",
];

fn matrix(rows: usize, cols: usize, seed: u64) -> HostMatrix {
    let mut m = crate::common::random_matrix(rows, cols, seed, 1.0);
    m.dtype = InputDtype::F32;
    m
}

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

fn f32_tensor<B: LowpBackend, const D: usize>(
    t: burn::tensor::ops::FloatTensor<B>,
) -> Tensor<B, D> {
    Tensor::from_primitive(TensorPrimitive::Float(t))
}

/// Each GEMM kind on quantized operands equals the f64 product of the dequantized operands (up to
/// the path's arithmetic), stays within the format's error bound of the high-precision product,
/// and takes the expected path (cuBLASLt FP8 / block / high precision, or BF16 emulation on CUDA).
/// Also checks BF16 outputs and accumulate-into.
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

fn values<BB: Backend, const D: usize>(t: Tensor<BB, D>) -> Vec<f32> {
    t.into_data().convert::<f32>().into_vec::<f32>().unwrap()
}

fn relative_error(got: &[f32], want: &[f32]) -> f64 {
    let err: f64 = got
        .iter()
        .zip(want)
        .map(|(g, w)| (*g as f64 - *w as f64).powi(2))
        .sum::<f64>();
    let norm: f64 = want.iter().map(|w| (*w as f64).powi(2)).sum::<f64>();
    (err / norm).sqrt()
}

fn assert_same(got: Vec<f32>, want: Vec<f32>, exactness: Exactness, what: &str) {
    match exactness {
        Exactness::Reference => assert_eq!(got, want, "{what}"),
        Exactness::Gpu => {
            let e = relative_error(&got, &want);
            assert!(e <= 8e-3, "{what}: relative error {e}");
        }
    }
}

pub fn check_identity_recipe_matches_plain_burn<B: LowpBackend>(
    device: &B::Device,
    exactness: Exactness,
) {
    type AD<B> = Autodiff<B>;
    let linear: Linear<AD<B>> = LinearConfig::new(96, 64)
        .with_name("proj".into())
        .init(&recipe("bf16.json"), device)
        .unwrap();
    let linear = Linear {
        bias: Some(burn::module::Param::from_tensor(Tensor::random(
            [64],
            Distribution::Normal(0.0, 1.0),
            device,
        ))),
        ..linear
    };
    let x = Tensor::<AD<B>, 3>::random([2, 16, 96], Distribution::Normal(0.0, 1.0), device)
        .require_grad();
    let y = linear.forward(x.clone()).unwrap();
    // Plain Burn: the same expression with ordinary ops.
    let x_ref = Tensor::<AD<B>, 3>::from_inner(x.clone().inner()).require_grad();
    let w_ref = Tensor::<AD<B>, 2>::from_inner(linear.weight.val().inner()).require_grad();
    let b_ref =
        Tensor::<AD<B>, 1>::from_inner(linear.bias.as_ref().unwrap().val().inner()).require_grad();
    let y_ref = (x_ref
        .clone()
        .reshape([32, 96])
        .matmul(w_ref.clone().transpose())
        + b_ref.clone().unsqueeze())
    .reshape([2, 16, 64]);
    assert_same(
        values(y.clone().inner()),
        values(y_ref.clone().inner()),
        exactness,
        "forward",
    );
    let dy = Tensor::<AD<B>, 3>::random([2, 16, 64], Distribution::Normal(0.0, 1.0), device);
    let grads = (y * dy.clone()).sum().backward();
    let grads_ref = (y_ref * dy).sum().backward();
    assert_same(
        values(x.grad(&grads).unwrap()),
        values(x_ref.grad(&grads_ref).unwrap()),
        exactness,
        "dX",
    );
    assert_same(
        values(linear.weight.grad(&grads).unwrap()),
        values(w_ref.grad(&grads_ref).unwrap()),
        exactness,
        "dW",
    );
    assert_same(
        values(linear.bias.as_ref().unwrap().grad(&grads).unwrap()),
        values(b_ref.grad(&grads_ref).unwrap()),
        exactness,
        "db",
    );
}

/// The bias gradient of `Linear` is `Σ_rows dY`, through `column_sum`'s two stages (blocks of
/// 256 rows, then a tail of 232 rows): within f32 summation error of an f64 sum.
pub fn check_bias_gradient<B: LowpBackend>(device: &B::Device) {
    type AD<B> = Autodiff<B>;
    let (rows, features) = (1000, 24);
    let linear: Linear<AD<B>> = LinearConfig::new(16, features)
        .init(&recipe("bf16.json"), device)
        .unwrap();
    let x = Tensor::<AD<B>, 2>::random([rows, 16], Distribution::Normal(0.0, 1.0), device);
    let dy = matrix(rows, features, 9);
    let grads = (linear.forward(x).unwrap()
        * Tensor::<AD<B>, 2>::from_inner(f32_tensor(B::bytes_float_from_host(&dy, device))))
    .sum()
    .backward();
    let got = values(linear.bias.as_ref().unwrap().grad(&grads).unwrap());
    for c in 0..features {
        let column = (0..rows).map(|r| dy.values[r * features + c] as f64);
        let (want, scale) = column.fold((0.0, 0.0), |(s, a), v| (s + v, a + v.abs()));
        assert!(
            (got[c] as f64 - want).abs() <= 1e-5 * scale,
            "db[{c}] = {} vs {want}",
            got[c]
        );
    }
}

/// Gradients under every recipe against the f32 reference, within each format's error; also
/// current scaling with fast accumulation in all three GEMMs (TE's `fp8_gemm_*` set to
/// `use_split_accumulator: false`; on CUDA cuBLASLt's fast accumulation).
pub fn check_gradients<B: LowpBackend>(device: &B::Device, exactness: Exactness) {
    type AD<B> = Autodiff<B>;
    let mut failures = Vec::new();
    let fast = r#"{"recipe": "current_scaling",
        "fp8_gemm_fprop": {"use_split_accumulator": false},
        "fp8_gemm_dgrad": {"use_split_accumulator": false},
        "fp8_gemm_wgrad": {"use_split_accumulator": false}}"#;
    let recipes = RECIPES
        .iter()
        .map(|name| (*name, recipe(name)))
        .chain([("current_scaling, fast accumulation", Recipe::from_json(fast).unwrap())]);
    for (name, r) in recipes {
        let mut linear: Linear<AD<B>> = LinearConfig::new(256, 128)
            .with_name("layers.3.proj".into())
            .init(&r, device)
            .unwrap();
        // A bias that is not zero, so that the fprop GEMM's bias and its gradient show.
        linear.bias = Some(burn::module::Param::from_tensor(Tensor::random(
            [128],
            Distribution::Normal(0.0, 1.0),
            device,
        )));
        let x = Tensor::<AD<B>, 2>::random([128, 256], Distribution::Normal(0.0, 1.0), device)
            .require_grad();
        let dy = Tensor::<AD<B>, 2>::random([128, 128], Distribution::Normal(0.0, 1.0), device);
        let y = linear.forward(x.clone()).unwrap();
        let y_values = values(y.clone().inner());
        let grads = (y * dy.clone()).sum().backward();
        let w = linear.weight.val().inner();
        let bias = linear.bias.as_ref().unwrap();
        let (xi, dyi) = (x.clone().inner(), dy.inner());
        let y_ref = values(xi.clone().matmul(w.clone().transpose()) + bias.val().inner().unsqueeze::<2>());
        let db_ref = values(dyi.clone().sum_dim(0).reshape([128]));
        let dx_ref = values(dyi.clone().matmul(w.clone()));
        let dw_ref = values(dyi.transpose().matmul(xi));
        let bound = if name.contains("nvfp4") {
            0.3
        } else if name == "bf16.json" {
            match exactness {
                Exactness::Reference => 1e-6,
                Exactness::Gpu => 8e-3,
            }
        } else {
            0.12
        };
        let rdx = relative_error(&values(x.grad(&grads).unwrap()), &dx_ref);
        let rdw = relative_error(&values(linear.weight.grad(&grads).unwrap()), &dw_ref);
        let ry = relative_error(&y_values, &y_ref);
        // dbias is dY's column sums in f32 whatever the recipe (dY's quantization does not enter).
        let rdb = relative_error(&values(bias.grad(&grads).unwrap()), &db_ref);
        println!("{name}: Y {ry:.2e}, dX {rdx:.2e}, dW {rdw:.2e}, dbias {rdb:.2e}");
        if !(ry <= bound && rdx <= bound && rdw <= bound && rdb <= 1e-5) {
            failures.push(format!("{name}: Y {ry}, dX {rdx}, dW {rdw}, dbias {rdb} (bound {bound}, dbias 1e-5)"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[derive(Module, Debug)]
pub struct Mlp<B: Backend> {
    fc1: LayerNormLinear<B>,
    fc2: Linear<B>,
}

impl<B: burn_lowp::ops::LowpLinear> Mlp<B> {
    fn forward(&self, x: Tensor<B, 2>) -> Tensor<B, 2> {
        let (h, _) = self.fc1.forward(x).unwrap();
        self.fc2.forward(burn::tensor::activation::relu(h)).unwrap()
    }
}

pub fn check_mlp_learns_under_every_recipe<B: LowpBackend>(device: &B::Device) {
    type AD<B> = Autodiff<B>;
    let teacher = Tensor::<B, 2>::random([128, 128], Distribution::Normal(0.0, 0.1), device);
    let mut failures = Vec::new();
    for name in RECIPES {
        let r = recipe(name);
        let mut model = Mlp::<AD<B>> {
            fc1: LayerNormLinearConfig::new(128, 256)
                .with_name("layers.1.fc1".into())
                .init(&r, device)
                .unwrap(),
            fc2: LinearConfig::new(256, 128)
                .with_name("layers.1.fc2".into())
                .with_init_std(0.02)
                .init(&r, device)
                .unwrap(),
        };
        let mut optim = AdamConfig::new().init();
        let mut losses = Vec::new();
        for step in 0..40 {
            let x = Tensor::<B, 2>::random([128, 128], Distribution::Normal(0.0, 1.0), device);
            let target = Tensor::<AD<B>, 2>::from_inner(x.clone().matmul(teacher.clone()).tanh());
            let loss = (model.forward(Tensor::from_inner(x)) - target)
                .powi_scalar(2)
                .mean();
            losses.push(loss.clone().into_scalar().elem::<f32>());
            let grads = GradientsParams::from_grads(loss.backward(), &model);
            model.fc1.end_step().unwrap();
            model.fc2.end_step().unwrap();
            model = optim.step(3e-3, model, grads);
            assert!(
                losses[step].is_finite(),
                "{name}: loss {} at step {step}",
                losses[step]
            );
        }
        let (first, last) = (
            losses[..5].iter().sum::<f32>() / 5.0,
            losses[35..].iter().sum::<f32>() / 5.0,
        );
        println!("{name}: loss {first:.4} -> {last:.4}");
        if !(last < 0.6 * first) {
            failures.push(format!(
                "{name}: loss {first} -> {last} did not fall enough"
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Burn's `num_params` counts trainable weights only: a 64 -> 128 -> 64 MLP (LayerNorm 128,
/// 8192 + 128, 8192 + 64) has 16704 under the recipes that can block 64 features, delayed
/// scaling's amax histories and scales (state, saved with the record) not included.
pub fn check_num_params_counts_weights_only<B: LowpBackend>(device: &B::Device) {
    for name in ["bf16.json", "delayed_scaling.json", "current_scaling.json", "mxfp8.json"] {
        let r = recipe(name);
        let model = Mlp::<B> {
            fc1: LayerNormLinearConfig::new(64, 128).init(&r, device).unwrap(),
            fc2: LinearConfig::new(128, 64).init(&r, device).unwrap(),
        };
        assert_eq!(model.num_params(), 16704, "{name}");
    }
}

pub fn check_weight_cache<B: LowpBackend>(device: &B::Device) {
    type AD<B> = Autodiff<B>;
    for name in ["mxfp8.json", "current_scaling.json"] {
        let linear: Linear<AD<B>> = LinearConfig::new(128, 64)
            .init(&recipe(name), device)
            .unwrap();
        let xs: Vec<Tensor<AD<B>, 2>> = (0..4)
            .map(|_| Tensor::random([32, 128], Distribution::Normal(0.0, 1.0), device))
            .collect();
        let first = linear
            .forward_microbatch(xs[0].clone(), Some(true))
            .unwrap();
        assert_eq!(linear.weight_quantizations(), 1, "{name}");
        for x in &xs[1..] {
            linear.forward_microbatch(x.clone(), Some(false)).unwrap();
        }
        assert_eq!(
            linear.weight_quantizations(),
            1,
            "{name}: cached micro-batches quantize no weight"
        );
        let again = linear
            .forward_microbatch(xs[0].clone(), Some(false))
            .unwrap();
        assert_eq!(
            values(first.inner()),
            values(again.inner()),
            "{name}: the cached weight gives identical outputs"
        );
        linear.forward(xs[1].clone()).unwrap();
        assert_eq!(
            linear.weight_quantizations(),
            2,
            "{name}: no cache: quantize"
        );
        // An optimizer step maps the parameters: the cache empties and the next call quantizes.
        let loss = linear
            .forward_microbatch(xs[0].clone(), Some(true))
            .unwrap()
            .sum();
        let grads = GradientsParams::from_grads(loss.backward(), &linear);
        let linear = AdamConfig::new().init().step(1e-2, linear, grads);
        let before = linear.weight_quantizations();
        linear
            .forward_microbatch(xs[0].clone(), Some(false))
            .unwrap();
        assert_eq!(
            linear.weight_quantizations(),
            before + 1,
            "{name}: a changed weight is quantized again"
        );
    }
}

/// LayerNorm's gradients through the row-broadcast ops (γ, β, and X through the normalization)
/// against the same expression in plain Burn ops, on 600 rows (two blocks of 256 and a tail):
/// within f32 summation error (the sums run in a different order).
pub fn check_layernorm_gradients<B: LowpBackend + burn_lowp::ops::LowpLinear>(device: &B::Device) {
    type AD<B> = Autodiff<B>;
    let (rows, features) = (600, 32);
    let module: LayerNormLinear<AD<B>> = LayerNormLinearConfig::new(features, 16)
        .with_return_layernorm_output(true)
        .init(&recipe("bf16.json"), device)
        .unwrap();
    let gamma = Tensor::<AD<B>, 1>::random([features], Distribution::Normal(1.0, 0.5), device);
    let beta = Tensor::<AD<B>, 1>::random([features], Distribution::Normal(0.0, 0.5), device);
    let module = LayerNormLinear {
        norm_weight: burn::module::Param::from_tensor(gamma.clone()),
        norm_bias: Some(burn::module::Param::from_tensor(beta.clone())),
        ..module
    };
    let x = Tensor::<AD<B>, 2>::random([rows, features], Distribution::Normal(0.5, 2.0), device)
        .require_grad();
    let dy = Tensor::<AD<B>, 2>::random([rows, features], Distribution::Normal(0.0, 1.0), device);
    let (_, ln) = module.forward(x.clone()).unwrap();
    let grads = (ln.unwrap() * dy.clone()).sum().backward();
    // Plain Burn.
    let x_ref = Tensor::<AD<B>, 2>::from_inner(x.clone().inner()).require_grad();
    let g_ref = Tensor::<AD<B>, 1>::from_inner(gamma.inner()).require_grad();
    let b_ref = Tensor::<AD<B>, 1>::from_inner(beta.inner()).require_grad();
    let centered = x_ref.clone() - x_ref.clone().mean_dim(1);
    let var = centered.clone().powi_scalar(2).mean_dim(1);
    let ln_ref =
        centered / (var + 1e-5).sqrt() * g_ref.clone().unsqueeze() + b_ref.clone().unsqueeze();
    let grads_ref = (ln_ref * dy).sum().backward();
    let close = |got: Vec<f32>, want: Vec<f32>, what: &str| {
        let scale = want.iter().map(|v| v.abs()).fold(0.0f32, f32::max).max(1.0);
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert!((g - w).abs() <= 1e-4 * scale, "{what}[{i}]: {g} vs {w}");
        }
    };
    close(
        values(module.norm_weight.grad(&grads).unwrap()),
        values(g_ref.grad(&grads_ref).unwrap()),
        "dgamma",
    );
    close(
        values(module.norm_bias.as_ref().unwrap().grad(&grads).unwrap()),
        values(b_ref.grad(&grads_ref).unwrap()),
        "dbeta",
    );
    close(
        values(x.grad(&grads).unwrap()),
        values(x_ref.grad(&grads_ref).unwrap()),
        "dX",
    );
}

pub fn check_layernorm_linear<B: LowpBackend + burn_lowp::ops::LowpLinear>(device: &B::Device) {
    type AD<B> = Autodiff<B>;
    let x = Tensor::<B, 2>::random([32, 64], Distribution::Normal(2.0, 3.0), device);
    let xv = values(x.clone());
    for (normalization, zero_centered) in [
        (Normalization::LayerNorm, false),
        (Normalization::RmsNorm, false),
        (Normalization::LayerNorm, true),
    ] {
        let config = LayerNormLinearConfig::new(64, 32)
            .with_normalization(normalization)
            .with_zero_centered_gamma(zero_centered)
            .with_return_layernorm_output(true);
        let module: LayerNormLinear<B> = config.init(&recipe("bf16.json"), device).unwrap();
        let (y, ln) = module.forward(x.clone()).unwrap();
        let ln = values(ln.expect("return_layernorm_output"));
        for r in 0..32 {
            let row = &xv[r * 64..r * 64 + 64];
            let mean = if normalization == Normalization::LayerNorm {
                row.iter().map(|&v| v as f64).sum::<f64>() / 64.0
            } else {
                0.0
            };
            let var = row.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / 64.0;
            for c in 0..64 {
                let want = (row[c] as f64 - mean) / (var + 1e-5).sqrt();
                assert!(
                    (ln[r * 64 + c] as f64 - want).abs() < 1e-4,
                    "{normalization:?} zc={zero_centered} [{r},{c}]: {} vs {want}",
                    ln[r * 64 + c]
                );
            }
        }
        assert_eq!(y.dims(), [32, 32]);
    }
    let module: LayerNormLinear<B> = LayerNormLinearConfig::new(64, 32)
        .init(&recipe("mxfp8.json"), device)
        .unwrap();
    let err = module
        .forward(Tensor::<B, 2>::zeros([32, 48], device))
        .unwrap_err()
        .to_string();
    assert!(err.contains("in_features = 64"), "{err}");
    let err = LinearConfig::new(100, 64)
        .init::<B>(&recipe("mxfp8.json"), device)
        .unwrap_err()
        .to_string();
    assert!(err.contains("K = 100"), "{err}");
    // Tokens that the quantizer cannot block are a clear error, not a panic in backward.
    let linear: Linear<AD<B>> = LinearConfig::new(64, 64)
        .init(&recipe("mxfp8.json"), device)
        .unwrap();
    let err = linear
        .forward(Tensor::<AD<B>, 2>::zeros([20, 64], device).require_grad())
        .unwrap_err()
        .to_string();
    assert!(err.contains("M = 20"), "{err}");
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

macro_rules! module_suite {
    ($backend:ty, $device:expr, $exactness:expr) => {
        #[test]
        fn gemms_match_an_f64_reference_within_format_bounds() {
            if let Some(d) = $device {
                crate::suite::check_gemms::<$backend>(&d, $exactness);
            }
        }

        #[test]
        fn identity_recipe_matches_plain_burn() {
            if let Some(d) = $device {
                crate::suite::check_identity_recipe_matches_plain_burn::<$backend>(&d, $exactness);
            }
        }

        #[test]
        fn gradients_match_a_high_precision_reference() {
            if let Some(d) = $device {
                crate::suite::check_gradients::<$backend>(&d, $exactness);
            }
        }

        #[test]
        fn bias_gradient_sums_the_output_gradient_over_rows() {
            if let Some(d) = $device {
                crate::suite::check_bias_gradient::<$backend>(&d);
            }
        }

        #[test]
        fn layernorm_gradients_match_plain_burn() {
            if let Some(d) = $device {
                crate::suite::check_layernorm_gradients::<$backend>(&d);
            }
        }

        #[test]
        fn a_small_mlp_learns_under_every_recipe_file() {
            if let Some(d) = $device {
                crate::suite::check_mlp_learns_under_every_recipe::<$backend>(&d);
            }
        }

        #[test]
        fn num_params_counts_trainable_weights_only() {
            if let Some(d) = $device {
                crate::suite::check_num_params_counts_weights_only::<$backend>(&d);
            }
        }

        #[test]
        fn cached_weights_are_reused_until_the_weight_changes() {
            if let Some(d) = $device {
                crate::suite::check_weight_cache::<$backend>(&d);
            }
        }

        #[test]
        fn layernorm_linear_normalizes_like_the_formula() {
            if let Some(d) = $device {
                crate::suite::check_layernorm_linear::<$backend>(&d);
            }
        }
    };
}
pub(crate) use module_suite;

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
