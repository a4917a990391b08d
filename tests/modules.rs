//! Quantized GEMMs and the Linear / LayerNormLinear modules on NdArray (the reference backend):
//! GEMMs against an f64 reference, identity recipes against plain Burn, gradients against a
//! high-precision reference, a small MLP trained under every recipe file, the weight cache.

mod common;

use std::path::PathBuf;

use burn::backend::{Autodiff, NdArray};
use burn::module::Module;
use burn::optim::{AdamConfig, GradientsParams, Optimizer};
use burn::tensor::{Distribution, Tensor};
use burn_lowp::backend::{GemmKind, GemmOptions, LowpBackend};
use burn_lowp::format::fp8_block::BlockShape;
use burn_lowp::format::{Fp8Format, HostMatrix, InputDtype, Usage};
use burn_lowp::nn::{LayerNormLinear, LayerNormLinearConfig, Linear, LinearConfig, Normalization};
use burn_lowp::quant::{quantize, ColumnwiseSource, IdentityDtype, QuantizeCall, QuantizerSpec};
use burn_lowp::recipe::Recipe;

type Nd = NdArray;
type AD = Autodiff<NdArray>;

fn recipe(name: &str) -> Recipe {
    Recipe::load(
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("recipes")
            .join(name),
    )
    .unwrap()
}

const RECIPES: [&str; 8] = [
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
    let mut m = common::random_matrix(rows, cols, seed, 1.0);
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

/// Each GEMM kind on quantized operands equals the f64 product of the dequantized operands (up to
/// f32 accumulation), and stays within the format's error bound of the high-precision product.
#[test]
fn gemms_match_an_f64_reference_within_format_bounds() {
    let device = Default::default();
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
    // (name, activation/gradient quantizer, weight quantizer, relative Frobenius error bound).
    // Bounds: about twice the error each format shows on unit Gaussians (E4M3 ~2.5%, E5M2 ~5%,
    // NVFP4 ~10% per operand).
    let cases: Vec<(&str, QuantizerSpec, QuantizerSpec, f64)> = vec![
        (
            "identity",
            QuantizerSpec::Identity {
                dtype: IdentityDtype::F32,
            },
            QuantizerSpec::Identity {
                dtype: IdentityDtype::F32,
            },
            1e-6,
        ),
        ("fp8 e4m3", fp8(Fp8Format::E4M3), fp8(Fp8Format::E4M3), 0.06),
        (
            "fp8 e5m2 x e4m3",
            fp8(Fp8Format::E5M2),
            fp8(Fp8Format::E4M3),
            0.12,
        ),
        (
            "block 1x128 x 128x128",
            block(BlockShape::OneByOneTwentyEight),
            block(BlockShape::OneTwentyEightSquare),
            0.06,
        ),
        (
            "mxfp8",
            mx.clone(),
            QuantizerSpec::Mxfp8 {
                fp8: Fp8Format::E4M3,
                block_2d: true,
            },
            0.06,
        ),
        ("nvfp4 rht x 2d", nv(false, true), nv(true, false), 0.3),
        (
            "hybrid mxfp8/nvfp4",
            QuantizerSpec::Hybrid {
                rowwise: Box::new(mx.clone()),
                columnwise: Box::new(nv(false, true)),
                columnwise_source: ColumnwiseSource::Original,
            },
            mx.clone(),
            0.3,
        ),
    ];
    let x = matrix(m, k, 1); // X [M, K]
    let w = matrix(n, k, 2); // W [N, K]
    let dy = matrix(m, n, 3); // dY [M, N]
    let call = QuantizeCall::<Nd>::new(0);
    for (name, act, weight, bound) in cases {
        let q = |h: &HostMatrix, spec: &QuantizerSpec| {
            quantize::<Nd>(
                Nd::float_from_host(h, &device),
                spec,
                Usage::BOTH,
                false,
                &call,
            )
            .unwrap()
        };
        let (qx, qw, qdy) = (q(&x, &act), q(&w, &weight), q(&dy, &act));
        let f64s = |v: &[f32]| v.iter().map(|&x| x as f64).collect::<Vec<_>>();
        let deq = |t: &burn_lowp::quant::QuantizedTensor<Nd>, d| {
            f64s(&common::read_f32::<Nd>(Nd::lowp_dequantize(t, d).unwrap()))
        };
        for kind in [GemmKind::Fprop, GemmKind::Dgrad, GemmKind::Wgrad] {
            let (a, b, a_hp, b_hp, shape) = match kind {
                GemmKind::Fprop => (&qx, &qw, &x, &w, (m, n, k)),
                GemmKind::Dgrad => (&qdy, &qw, &dy, &w, (m, k, n)),
                GemmKind::Wgrad => (&qdy, &qx, &dy, &x, (n, k, m)),
            };
            let got =
                common::read_f32::<Nd>(Nd::lowp_gemm(kind, a, b, GemmOptions::default()).unwrap());
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
            for i in 0..got.len() {
                // f32 accumulation of `inner` products: |error| <= inner * 2^-24 * sum |a||b|.
                let tolerance = inner as f64 * 2f64.powi(-24) * abs[i] + 1e-30;
                assert!(
                    (got[i] as f64 - exact[i]).abs() <= tolerance,
                    "{name} {kind:?} [{i}]: {} vs {}",
                    got[i],
                    exact[i]
                );
            }
            let err: f64 = got
                .iter()
                .zip(&truth)
                .map(|(g, t)| (*g as f64 - t).powi(2))
                .sum::<f64>()
                .sqrt();
            let norm: f64 = truth.iter().map(|t| t * t).sum::<f64>().sqrt();
            assert!(
                err / norm <= bound,
                "{name} {kind:?}: relative error {} > {bound}",
                err / norm
            );
        }
    }
}

fn values<BB: burn::tensor::backend::Backend, const D: usize>(t: Tensor<BB, D>) -> Vec<f32> {
    t.into_data().convert::<f32>().into_vec::<f32>().unwrap()
}

#[test]
fn identity_recipe_matches_plain_burn_bit_for_bit() {
    let device = Default::default();
    let linear: Linear<AD> = LinearConfig::new(96, 64)
        .with_name("proj".into())
        .init(&recipe("bf16.json"), &device)
        .unwrap();
    let linear = Linear {
        bias: Some(burn::module::Param::from_tensor(Tensor::random(
            [64],
            Distribution::Normal(0.0, 1.0),
            &device,
        ))),
        ..linear
    };
    let x = Tensor::<AD, 3>::random([2, 16, 96], Distribution::Normal(0.0, 1.0), &device)
        .require_grad();
    let y = linear.forward(x.clone()).unwrap();
    // Plain Burn: the same expression with ordinary ops.
    let x_ref = Tensor::<AD, 3>::from_inner(x.clone().inner()).require_grad();
    let w_ref = Tensor::<AD, 2>::from_inner(linear.weight.val().inner()).require_grad();
    let b_ref =
        Tensor::<AD, 1>::from_inner(linear.bias.as_ref().unwrap().val().inner()).require_grad();
    let y_ref = (x_ref
        .clone()
        .reshape([32, 96])
        .matmul(w_ref.clone().transpose())
        + b_ref.clone().unsqueeze())
    .reshape([2, 16, 64]);
    assert_eq!(
        values(y.clone().inner()),
        values(y_ref.clone().inner()),
        "forward"
    );
    let dy = Tensor::<AD, 3>::random([2, 16, 64], Distribution::Normal(0.0, 1.0), &device);
    let grads = (y * dy.clone()).sum().backward();
    let grads_ref = (y_ref * dy).sum().backward();
    assert_eq!(
        values(x.grad(&grads).unwrap()),
        values(x_ref.grad(&grads_ref).unwrap()),
        "dX"
    );
    let dw = values(linear.weight.grad(&grads).unwrap());
    let dw_ref = values(w_ref.grad(&grads_ref).unwrap());
    assert_eq!(dw, dw_ref, "dW");
    assert_eq!(
        values(linear.bias.as_ref().unwrap().grad(&grads).unwrap()),
        values(b_ref.grad(&grads_ref).unwrap()),
        "db"
    );
}

/// Gradients under every recipe against the f32 reference, within each format's error.
#[test]
fn gradients_match_a_high_precision_reference() {
    let device = Default::default();
    for name in RECIPES {
        let linear: Linear<AD> = LinearConfig::new(256, 128)
            .with_name("layers.3.proj".into())
            .init(&recipe(name), &device)
            .unwrap();
        let x = Tensor::<AD, 2>::random([128, 256], Distribution::Normal(0.0, 1.0), &device)
            .require_grad();
        let dy = Tensor::<AD, 2>::random([128, 128], Distribution::Normal(0.0, 1.0), &device);
        let grads = (linear.forward(x.clone()).unwrap() * dy.clone())
            .sum()
            .backward();
        let w = linear.weight.val().inner();
        let (xi, dyi) = (x.clone().inner(), dy.inner());
        let dx_ref = dyi.clone().matmul(w.clone());
        let dw_ref = dyi.transpose().matmul(xi);
        let rel = |got: Tensor<Nd, 2>, want: Tensor<Nd, 2>| {
            let err = (got - want.clone())
                .powi_scalar(2)
                .sum()
                .sqrt()
                .into_scalar();
            err / want.powi_scalar(2).sum().sqrt().into_scalar()
        };
        let bound = if name.contains("nvfp4") {
            0.3
        } else if name == "bf16.json" {
            1e-6
        } else {
            0.12
        };
        let rdx = rel(x.grad(&grads).unwrap(), dx_ref);
        let rdw = rel(linear.weight.grad(&grads).unwrap(), dw_ref);
        assert!(
            rdx <= bound && rdw <= bound,
            "{name}: dX {rdx}, dW {rdw} (bound {bound})"
        );
    }
}

#[derive(Module, Debug)]
struct Mlp<B: burn::tensor::backend::Backend> {
    fc1: LayerNormLinear<B>,
    fc2: Linear<B>,
}

impl<B: burn_lowp::ops::LowpLinear> Mlp<B> {
    fn forward(&self, x: Tensor<B, 2>) -> Tensor<B, 2> {
        let (h, _) = self.fc1.forward(x).unwrap();
        self.fc2.forward(burn::tensor::activation::relu(h)).unwrap()
    }
}

#[test]
fn a_small_mlp_learns_under_every_recipe_file() {
    let device = Default::default();
    let teacher = Tensor::<Nd, 2>::random([128, 128], Distribution::Normal(0.0, 0.1), &device);
    for name in RECIPES {
        let r = recipe(name);
        let mut model = Mlp::<AD> {
            fc1: LayerNormLinearConfig::new(128, 256)
                .with_name("layers.1.fc1".into())
                .init(&r, &device)
                .unwrap(),
            fc2: LinearConfig::new(256, 128)
                .with_name("layers.1.fc2".into())
                .with_init_std(0.02)
                .init(&r, &device)
                .unwrap(),
        };
        let mut optim = AdamConfig::new().init();
        let mut losses = Vec::new();
        for step in 0..40 {
            let x = Tensor::<Nd, 2>::random([128, 128], Distribution::Normal(0.0, 1.0), &device);
            let target = Tensor::<AD, 2>::from_inner(x.clone().matmul(teacher.clone()).tanh());
            let loss = (model.forward(Tensor::from_inner(x)) - target)
                .powi_scalar(2)
                .mean();
            losses.push(loss.clone().into_scalar());
            let grads = GradientsParams::from_grads(loss.backward(), &model);
            model.fc1.end_step();
            model.fc2.end_step();
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
        assert!(
            last < 0.6 * first,
            "{name}: loss {first} -> {last} did not fall enough"
        );
    }
}

#[test]
fn cached_weights_are_reused_until_the_weight_changes() {
    let device = Default::default();
    let linear: Linear<AD> = LinearConfig::new(128, 64)
        .init(&recipe("mxfp8.json"), &device)
        .unwrap();
    let xs: Vec<Tensor<AD, 2>> = (0..4)
        .map(|_| Tensor::random([32, 128], Distribution::Normal(0.0, 1.0), &device))
        .collect();
    let first = linear
        .forward_microbatch(xs[0].clone(), Some(true))
        .unwrap();
    assert_eq!(linear.weight_quantizations(), 1);
    for x in &xs[1..] {
        linear.forward_microbatch(x.clone(), Some(false)).unwrap();
    }
    assert_eq!(
        linear.weight_quantizations(),
        1,
        "cached micro-batches quantize no weight"
    );
    let again = linear
        .forward_microbatch(xs[0].clone(), Some(false))
        .unwrap();
    assert_eq!(
        values(first.inner()),
        values(again.inner()),
        "the cached weight gives identical outputs"
    );
    linear.forward(xs[1].clone()).unwrap();
    assert_eq!(linear.weight_quantizations(), 2, "no cache: quantize");
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
        "a changed weight is quantized again"
    );
}

#[test]
fn layernorm_linear_normalizes_like_the_formula() {
    let device = Default::default();
    let x = Tensor::<Nd, 2>::random([32, 64], Distribution::Normal(2.0, 3.0), &device);
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
        let module: LayerNormLinear<Nd> = config.init(&recipe("bf16.json"), &device).unwrap();
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
                    "{normalization:?} zc={zero_centered} [{r},{c}]"
                );
            }
        }
        assert_eq!(y.dims(), [32, 32]);
    }
    let module: LayerNormLinear<Nd> = LayerNormLinearConfig::new(64, 32)
        .init(&recipe("mxfp8.json"), &device)
        .unwrap();
    let err = module
        .forward(Tensor::<Nd, 2>::zeros([32, 48], &device))
        .unwrap_err()
        .to_string();
    assert!(err.contains("in_features = 64"), "{err}");
    let err = LinearConfig::new(100, 64)
        .init::<Nd>(&recipe("mxfp8.json"), &device)
        .unwrap_err()
        .to_string();
    assert!(err.contains("K = 100"), "{err}");
    // Tokens that the quantizer cannot block are a clear error, not a panic in backward.
    let linear: Linear<AD> = LinearConfig::new(64, 64)
        .init(&recipe("mxfp8.json"), &device)
        .unwrap();
    let err = linear
        .forward(Tensor::<AD, 2>::zeros([20, 64], &device).require_grad())
        .unwrap_err()
        .to_string();
    assert!(err.contains("M = 20"), "{err}");
}
