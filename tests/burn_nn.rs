//! A burn-nn model's trained weights move into burn-lowp's modules and back (NdArray, CI): a small
//! burn-nn model trained a few steps with Burn's Adam, its modules converted under the bf16
//! recipe (which keeps f32 on NdArray), the same outputs; exported back to burn-nn, the same
//! weights bit for bit and so the same outputs; bad shapes and options are errors naming them.

use burn::backend::{Autodiff, NdArray};
use burn::module::Module;
use burn::nn::{LayerNorm, LayerNormConfig, Linear as BurnLinear, LinearConfig as BurnLinearConfig, RmsNormConfig};
use burn::optim::{AdamConfig, GradientsParams, Optimizer};
use burn::tensor::activation::relu;
use burn::tensor::{Distribution, Tensor};
use burn_lowp::nn::burn_nn::BurnNorm;
use burn_lowp::nn::{LayerNormLinearConfig, LayerNormMlpConfig, LinearConfig, Normalization};
use burn_lowp::ops::Activation;
use burn_lowp::recipe::Recipe;

type AD = Autodiff<NdArray>;

/// A burn-nn block: LayerNorm -> Linear -> relu -> Linear, and a head Linear.
#[derive(Module, Debug)]
struct BurnBlock<B: burn::tensor::backend::Backend> {
    norm: LayerNorm<B>,
    fc1: BurnLinear<B>,
    fc2: BurnLinear<B>,
    head: BurnLinear<B>,
}

impl<B: burn::tensor::backend::Backend> BurnBlock<B> {
    fn mlp(&self, x: Tensor<B, 2>) -> Tensor<B, 2> {
        self.fc2.forward(relu(self.fc1.forward(self.norm.forward(x))))
    }
    fn forward(&self, x: Tensor<B, 2>) -> Tensor<B, 2> {
        self.head.forward(self.mlp(x.clone()) + x)
    }
}

fn values<const D: usize>(t: Tensor<AD, D>) -> Vec<f32> {
    t.into_data().convert::<f32>().into_vec().unwrap()
}

/// ‖a − b‖ / ‖b‖.
fn relative(a: &[f32], b: &[f32]) -> f64 {
    let (mut num, mut den) = (0f64, 0f64);
    for (x, y) in a.iter().zip(b) {
        num += (*x as f64 - *y as f64).powi(2);
        den += (*y as f64).powi(2);
    }
    (num / den).sqrt()
}

fn trained_block() -> BurnBlock<AD> {
    let device = Default::default();
    let mut block = BurnBlock {
        norm: LayerNormConfig::new(64).init(&device),
        fc1: BurnLinearConfig::new(64, 128).init(&device),
        fc2: BurnLinearConfig::new(128, 64).init(&device),
        head: BurnLinearConfig::new(64, 32).init(&device),
    };
    let mut optim = AdamConfig::new().init();
    let x = Tensor::<AD, 2>::random([16, 64], Distribution::Normal(0.0, 1.0), &device);
    let target = Tensor::<AD, 2>::random([16, 32], Distribution::Normal(0.0, 1.0), &device);
    for _ in 0..3 {
        let loss = (block.forward(x.clone()) - target.clone()).powi_scalar(2).mean();
        let grads = GradientsParams::from_grads(loss.backward(), &block);
        block = optim.step(1e-2, block, grads);
    }
    block
}

#[test]
fn burn_nn_weights_train_in_burn_lowp_modules_and_export_back() {
    let device = Default::default();
    let block = trained_block();
    let recipe = Recipe::from_json(r#"{"recipe": "bf16"}"#).unwrap();
    let x = Tensor::<AD, 2>::random([24, 64], Distribution::Normal(0.0, 1.0), &device);

    // Linear: the same GEMM on NdArray, so the same output bit for bit.
    let head = LinearConfig::new(64, 32).with_name("head".into()).init_from_burn(block.head.clone(), &recipe).unwrap();
    assert_eq!(values(head.forward(x.clone()).unwrap()), values(block.head.forward(x.clone())));
    let back = head.to_burn();
    assert_eq!(values(back.weight.val()), values(block.head.weight.val()));
    assert_eq!(values(back.bias.clone().unwrap().val()), values(block.head.bias.clone().unwrap().val()));

    // LayerNormMlp: our norm computes mean and variance in another order than Burn's
    // LayerNorm, so the output agrees to f32 rounding, not bit for bit.
    let mlp = LayerNormMlpConfig::new(64, 128)
        .with_activation(Activation::Relu)
        .with_name("mlp".into())
        .init_from_burn(block.norm.clone(), block.fc1.clone(), block.fc2.clone(), &recipe)
        .unwrap();
    let ours = values(mlp.forward(x.clone()).unwrap().0);
    let theirs = values(block.mlp(x.clone()));
    assert!(relative(&ours, &theirs) < 1e-5, "relative error {}", relative(&ours, &theirs));
    // Exported back: the same parameters, so burn-nn's own forward gives exactly its output.
    let (norm, fc1, fc2) = mlp.to_burn();
    let BurnNorm::LayerNorm(norm) = norm else { panic!("a LayerNorm config exports a LayerNorm") };
    let exported = BurnBlock { norm, fc1, fc2, head: back };
    assert_eq!(values(exported.mlp(x.clone())), theirs);
    assert_eq!(values(exported.forward(x.clone())), values(block.forward(x.clone())));

    // LayerNormLinear with a zero-centred gamma stores gamma - 1 and exports gamma.
    let lnl = LayerNormLinearConfig::new(64, 128)
        .with_zero_centered_gamma(true)
        .init_from_burn(block.norm.clone(), block.fc1.clone(), &recipe)
        .unwrap();
    let theirs = values(block.fc1.forward(block.norm.forward(x.clone())));
    let ours = values(lnl.forward(x.clone()).unwrap().0);
    assert!(relative(&ours, &theirs) < 1e-5, "relative error {}", relative(&ours, &theirs));
    let (BurnNorm::LayerNorm(norm), _) = lnl.to_burn() else { panic!("LayerNorm") };
    let (a, b) = (values(norm.gamma.val()), values(block.norm.gamma.val()));
    assert!(a.iter().zip(&b).all(|(x, y)| (x - y).abs() <= 1e-6 * y.abs().max(1.0)), "gamma round trip");
}

#[test]
fn a_config_that_does_not_fit_the_burn_nn_module_is_an_error_naming_it() {
    let device = Default::default();
    let recipe = Recipe::from_json(r#"{"recipe": "bf16"}"#).unwrap();
    let linear: BurnLinear<AD> = BurnLinearConfig::new(64, 32).init(&device);
    let err = LinearConfig::new(32, 64).init_from_burn(linear.clone(), &recipe).unwrap_err().to_string();
    assert!(err.contains("linear weight") && err.contains("[64, 32]") && err.contains("[32, 64]"), "{err}");
    let err = LinearConfig::new(64, 32).with_bias(false).init_from_burn(linear.clone(), &recipe).unwrap_err().to_string();
    assert!(err.contains("linear bias") && err.contains("present"), "{err}");
    let rms = RmsNormConfig::new(64).init::<AD>(&device);
    let err = LayerNormLinearConfig::new(64, 32).init_from_burn(rms.clone(), linear.clone(), &recipe).unwrap_err().to_string();
    assert!(err.contains("norm") && err.contains("RmsNorm") && err.contains("LayerNorm"), "{err}");
    // The matching config takes it.
    LayerNormLinearConfig::new(64, 32)
        .with_normalization(Normalization::RmsNorm)
        .init_from_burn(rms, linear, &recipe)
        .unwrap();
}
