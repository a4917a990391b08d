//! Moving a model between burn-nn's modules and burn-lowp's: a trained `burn::nn::Linear`,
//! `LayerNorm` or `RmsNorm` (built from a record or a checkpoint the usual Burn way) becomes the
//! weights of a burn-lowp `Linear`, `LayerNormLinear` or `LayerNormMlp` under a recipe, and the
//! trained weights go back as burn-nn modules (whose records Burn saves and loads as any other).
//!
//! ```text
//! let fc = burn::nn::LinearConfig::new(512, 256).init(&device).load_record(record);
//! let fc = burn_lowp::nn::LinearConfig::new(512, 256).init_from_burn(fc, &recipe)?;   // train under the recipe
//! let back: burn::nn::Linear<B> = fc.to_burn();                                       // export
//! ```
//!
//! burn-nn keeps a linear weight as `[in, out]` (`y = x · W + b`; its `Col` layout transposes on
//! save and load, so the module always holds `[in, out]`), burn-lowp as `[out, in]` (TE's
//! layout): the weight is transposed each way, the values untouched. A config whose shapes or
//! options do not fit the given modules is an error naming the tensor, before anything is built.

use burn::module::Param;
use burn::nn::{LayerNorm, LayerNormConfig, RmsNorm, RmsNormConfig};
use burn::tensor::backend::Backend;
use burn::tensor::Tensor;

use super::layernorm_linear::{LayerNormLinear, LayerNormLinearConfig, Normalization};
use super::layernorm_mlp::{LayerNormMlp, LayerNormMlpConfig};
use super::linear::{Linear, LinearConfig};
use crate::error::LowpError;
use crate::recipe::Recipe;

/// The burn-nn normalization in front of a `LayerNormLinear` or `LayerNormMlp`.
#[derive(Debug, Clone)]
pub enum BurnNorm<B: Backend> {
    LayerNorm(LayerNorm<B>),
    RmsNorm(RmsNorm<B>),
}

impl<B: Backend> From<LayerNorm<B>> for BurnNorm<B> {
    fn from(norm: LayerNorm<B>) -> Self {
        BurnNorm::LayerNorm(norm)
    }
}

impl<B: Backend> From<RmsNorm<B>> for BurnNorm<B> {
    fn from(norm: RmsNorm<B>) -> Self {
        BurnNorm::RmsNorm(norm)
    }
}

/// A new trainable parameter holding `t`'s values (detached: on an autodiff backend a transposed
/// or shifted tensor is not a leaf of the graph, and a parameter must be one).
fn param<B: Backend, const D: usize>(t: Tensor<B, D>) -> Param<Tensor<B, D>> {
    Param::from_tensor(t.detach())
}

fn check(tensor: &str, have: &[usize], want: &[usize]) -> Result<(), LowpError> {
    if have != want {
        return Err(LowpError::shape(tensor, format!("{have:?}"), format!("the config needs {want:?}")));
    }
    Ok(())
}

/// burn-nn's `[in, out]` weight (and bias) as ours: `[out, in]`, checked against the config.
fn linear_params<B: Backend>(
    what: &str,
    linear: &burn::nn::Linear<B>,
    (in_features, out_features): (usize, usize),
    with_bias: bool,
) -> Result<(Param<Tensor<B, 2>>, Option<Param<Tensor<B, 1>>>), LowpError> {
    check(&format!("{what} weight"), &linear.weight.dims(), &[in_features, out_features])?;
    let bias = match (&linear.bias, with_bias) {
        (Some(b), true) => {
            check(&format!("{what} bias"), &b.dims(), &[out_features])?;
            Some(param(b.val()))
        }
        (None, false) => None,
        (have, _) => {
            return Err(LowpError::invalid(
                format!("{what} bias"),
                if have.is_some() { "present" } else { "absent" },
                format!("the config's bias = {with_bias} must match the burn-nn module"),
            ))
        }
    };
    Ok((param(linear.weight.val().transpose()), bias))
}

/// Our `[out, in]` weight and bias as a burn-nn `Linear` (`[in, out]`, Row layout).
fn burn_linear<B: Backend>(weight: &Param<Tensor<B, 2>>, bias: Option<&Param<Tensor<B, 1>>>) -> burn::nn::Linear<B> {
    burn::nn::Linear {
        weight: param(weight.val().transpose()),
        bias: bias.map(|b| param(b.val())),
    }
}

/// A burn-nn norm's gamma (and LayerNorm's beta) as ours, checked against the config's kind and
/// width; zero-centred gammas are stored as `gamma - 1`.
#[allow(clippy::type_complexity)]
fn norm_params<B: Backend>(
    norm: &BurnNorm<B>,
    normalization: Normalization,
    zero_centered_gamma: bool,
    width: usize,
) -> Result<(Param<Tensor<B, 1>>, Option<Param<Tensor<B, 1>>>), LowpError> {
    let (gamma, beta) = match (norm, normalization) {
        (BurnNorm::LayerNorm(n), Normalization::LayerNorm) => (n.gamma.val(), n.beta.as_ref().map(|b| b.val())),
        (BurnNorm::RmsNorm(n), Normalization::RmsNorm) => (n.gamma.val(), None),
        (_, want) => {
            return Err(LowpError::invalid(
                "norm",
                match norm {
                    BurnNorm::LayerNorm(_) => "LayerNorm",
                    BurnNorm::RmsNorm(_) => "RmsNorm",
                },
                format!("the config's normalization is {want:?}"),
            ))
        }
    };
    check("norm gamma", &gamma.dims(), &[width])?;
    let device = gamma.device();
    // Ours adds the LayerNorm bias even when burn-nn's has none: a zero beta is the same norm.
    let beta = match normalization {
        Normalization::LayerNorm => Some(param(beta.unwrap_or_else(|| Tensor::zeros([width], &device)))),
        Normalization::RmsNorm => None,
    };
    let gamma = if zero_centered_gamma { gamma - 1.0 } else { gamma };
    Ok((param(gamma), beta))
}

/// Our norm parameters as the burn-nn module of that kind with epsilon `eps`.
fn burn_norm<B: Backend>(
    gamma: &Param<Tensor<B, 1>>,
    beta: Option<&Param<Tensor<B, 1>>>,
    normalization: Normalization,
    zero_centered_gamma: bool,
    eps: f64,
) -> BurnNorm<B> {
    let device = gamma.val().device();
    let width = gamma.dims()[0];
    let gamma = if zero_centered_gamma { gamma.val() + 1.0 } else { gamma.val() };
    match normalization {
        Normalization::LayerNorm => {
            let mut norm = LayerNormConfig::new(width).with_epsilon(eps).init(&device);
            norm.gamma = param(gamma);
            norm.beta = beta.map(|b| param(b.val()));
            BurnNorm::LayerNorm(norm)
        }
        Normalization::RmsNorm => {
            let mut norm = RmsNormConfig::new(width).with_epsilon(eps).init(&device);
            norm.gamma = param(gamma);
            BurnNorm::RmsNorm(norm)
        }
    }
}

impl LinearConfig {
    /// A burn-lowp `Linear` with `linear`'s trained weights, quantized as `recipe` says.
    pub fn init_from_burn<B: Backend>(&self, linear: burn::nn::Linear<B>, recipe: &Recipe) -> Result<Linear<B>, LowpError> {
        let device = linear.weight.val().device();
        let (weight, bias) = linear_params("linear", &linear, (self.in_features, self.out_features), self.bias)?;
        let mut module = self.init::<B>(recipe, &device)?;
        module.weight = weight;
        module.bias = bias;
        Ok(module)
    }
}

impl<B: Backend> Linear<B> {
    /// The weights as a burn-nn `Linear` (`[in, out]`).
    pub fn to_burn(&self) -> burn::nn::Linear<B> {
        burn_linear(&self.weight, self.bias.as_ref())
    }
}

impl LayerNormLinearConfig {
    /// A burn-lowp `LayerNormLinear` from a burn-nn norm and the linear after it. The config's
    /// `eps` is the norm's (burn-nn keeps LayerNorm's epsilon private, so it is not read).
    pub fn init_from_burn<B: Backend>(
        &self,
        norm: impl Into<BurnNorm<B>>,
        linear: burn::nn::Linear<B>,
        recipe: &Recipe,
    ) -> Result<LayerNormLinear<B>, LowpError> {
        let norm = norm.into();
        let device = linear.weight.val().device();
        let (norm_weight, norm_bias) = norm_params(&norm, self.normalization, self.zero_centered_gamma, self.in_features)?;
        let (weight, bias) = linear_params("linear", &linear, (self.in_features, self.out_features), self.bias)?;
        let mut module = self.init::<B>(recipe, &device)?;
        (module.norm_weight, module.norm_bias, module.weight, module.bias) = (norm_weight, norm_bias, weight, bias);
        Ok(module)
    }
}

impl<B: Backend> LayerNormLinear<B> {
    /// The weights as burn-nn modules: the norm (with this module's epsilon) and the linear.
    pub fn to_burn(&self) -> (BurnNorm<B>, burn::nn::Linear<B>) {
        (
            burn_norm(&self.norm_weight, self.norm_bias.as_ref(), self.normalization, self.zero_centered_gamma, self.eps),
            burn_linear(&self.weight, self.bias.as_ref()),
        )
    }
}

impl LayerNormMlpConfig {
    /// A burn-lowp `LayerNormMlp` from a burn-nn norm and the two linears around the config's
    /// activation (`fc1` is `hidden -> ffn`, or `hidden -> 2 ffn` for gated activations).
    pub fn init_from_burn<B: Backend>(
        &self,
        norm: impl Into<BurnNorm<B>>,
        fc1: burn::nn::Linear<B>,
        fc2: burn::nn::Linear<B>,
        recipe: &Recipe,
    ) -> Result<LayerNormMlp<B>, LowpError> {
        let norm = norm.into();
        let device = fc1.weight.val().device();
        let mut module = self.init::<B>(recipe, &device)?;
        let [fc1_out, _] = module.fc1_weight.dims();
        let (norm_weight, norm_bias) = norm_params(&norm, self.normalization, self.zero_centered_gamma, self.hidden_size)?;
        let (fc1_weight, fc1_bias) = linear_params("fc1", &fc1, (self.hidden_size, fc1_out), self.bias)?;
        let (fc2_weight, fc2_bias) = linear_params("fc2", &fc2, (self.ffn_hidden_size, self.hidden_size), self.bias)?;
        module.layer_norm_weight = norm_weight;
        module.layer_norm_bias = norm_bias;
        (module.fc1_weight, module.fc1_bias, module.fc2_weight, module.fc2_bias) = (fc1_weight, fc1_bias, fc2_weight, fc2_bias);
        Ok(module)
    }
}

impl<B: Backend> LayerNormMlp<B> {
    /// The weights as burn-nn modules: the norm (with this module's epsilon), fc1 and fc2.
    pub fn to_burn(&self) -> (BurnNorm<B>, burn::nn::Linear<B>, burn::nn::Linear<B>) {
        (
            burn_norm(&self.layer_norm_weight, self.layer_norm_bias.as_ref(), self.normalization, self.zero_centered_gamma, self.eps),
            burn_linear(&self.fc1_weight, self.fc1_bias.as_ref()),
            burn_linear(&self.fc2_weight, self.fc2_bias.as_ref()),
        )
    }
}
