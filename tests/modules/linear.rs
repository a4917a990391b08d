//! `Linear` and `LayerNormLinear` under the recipes: the identity recipe equals plain Burn,
//! gradients against a high-precision reference, the bias and LayerNorm gradients, a small MLP
//! trained under every recipe file, the parameter count and the weight cache (`module_suite!`
//! calls these).
#![allow(dead_code)]

use burn::backend::Autodiff;
use burn::module::Module;
use burn::optim::{AdamConfig, GradientsParams, Optimizer};
use burn::tensor::backend::Backend;
use burn::tensor::{Distribution, ElementConversion, Tensor};
use burn_lowp::backend::LowpBackend;
use burn_lowp::nn::{LayerNormLinear, LayerNormLinearConfig, Linear, LinearConfig, Normalization};
use burn_lowp::recipe::Recipe;

use crate::suite::{assert_same, f32_tensor, matrix, recipe, relative_error, values, Exactness, RECIPES};

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
