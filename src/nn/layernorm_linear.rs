//! `LayerNormLinear`: LayerNorm or RMSNorm over the last dimension, then a quantized `Linear`
//! (TE's module of the same name). The norm runs in high precision as ordinary Burn ops;
//! `zero_centered_gamma` stores γ - 1; `return_layernorm_output` also returns the norm's output.

use burn::config::Config;
use burn::module::{Module, Param};
use burn::tensor::backend::Backend;
use burn::tensor::{Distribution, Tensor, TensorPrimitive};
use serde::{Deserialize, Serialize};

use super::linear::linear_forward;
use super::lowp_state::LowpState;
use crate::error::LowpError;
use crate::ops::LowpLinear;
use crate::recipe::{BoundaryRoles, ModuleKind, Recipe, SlotLayout};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Normalization {
    LayerNorm,
    RmsNorm,
}

#[derive(Config, Debug)]
pub struct LayerNormLinearConfig {
    pub in_features: usize,
    pub out_features: usize,
    #[config(default = 1e-5)]
    pub eps: f64,
    #[config(default = "Normalization::LayerNorm")]
    pub normalization: Normalization,
    #[config(default = false)]
    pub zero_centered_gamma: bool,
    #[config(default = true)]
    pub bias: bool,
    #[config(default = false)]
    pub return_layernorm_output: bool,
    #[config(default = "String::new()")]
    pub name: String,
    #[config(default = 0.023)]
    pub init_std: f64,
}

#[derive(Module, Debug)]
pub struct LayerNormLinear<B: Backend> {
    pub norm_weight: Param<Tensor<B, 1>>,
    /// LayerNorm only.
    pub norm_bias: Option<Param<Tensor<B, 1>>>,
    pub weight: Param<Tensor<B, 2>>,
    pub bias: Option<Param<Tensor<B, 1>>>,
    pub lowp: LowpState<B>,
    #[module(skip)]
    pub eps: f64,
    #[module(skip)]
    pub normalization: Normalization,
    #[module(skip)]
    pub zero_centered_gamma: bool,
    #[module(skip)]
    pub return_layernorm_output: bool,
}

impl LayerNormLinearConfig {
    pub fn init<B: Backend>(
        &self,
        recipe: &Recipe,
        device: &B::Device,
    ) -> std::result::Result<LayerNormLinear<B>, LowpError> {
        let layout = SlotLayout::new(
            ModuleKind::LayerNormLinear,
            &self.name,
            &BoundaryRoles::default(),
        );
        let lowp = LowpState::new(
            recipe,
            layout,
            &[(self.out_features, self.in_features)],
            device,
        )?;
        let gamma = if self.zero_centered_gamma {
            Tensor::zeros([self.in_features], device)
        } else {
            Tensor::ones([self.in_features], device)
        };
        Ok(LayerNormLinear {
            norm_weight: Param::from_tensor(gamma),
            norm_bias: (self.normalization == Normalization::LayerNorm)
                .then(|| Param::from_tensor(Tensor::zeros([self.in_features], device))),
            weight: Param::from_tensor(Tensor::random(
                [self.out_features, self.in_features],
                Distribution::Normal(0.0, self.init_std),
                device,
            )),
            bias: self
                .bias
                .then(|| Param::from_tensor(Tensor::zeros([self.out_features], device))),
            lowp,
            eps: self.eps,
            normalization: self.normalization,
            zero_centered_gamma: self.zero_centered_gamma,
            return_layernorm_output: self.return_layernorm_output,
        })
    }
}

impl<B: LowpLinear> LayerNormLinear<B> {
    /// The normalization alone: `(x - μ) / sqrt(σ² + ε) · γ + β` or `x / sqrt(mean(x²) + ε) · γ`.
    pub fn normalize<const D: usize>(&self, x: Tensor<B, D>) -> Tensor<B, D> {
        normalize(
            x,
            &self.norm_weight,
            self.norm_bias.as_ref(),
            self.eps,
            self.normalization,
            self.zero_centered_gamma,
        )
    }

    /// End of a training step: delayed-scaling scales are updated (no-op for other recipes).
    /// Errors only on delayed-scaling state that does not fit the module (a foreign record).
    pub fn end_step(&self) -> Result<(), LowpError> {
        self.lowp.end_step()
    }

    /// Returns the linear output, and the norm's output when `return_layernorm_output`.
    pub fn forward<const D: usize>(
        &self,
        x: Tensor<B, D>,
    ) -> std::result::Result<(Tensor<B, D>, Option<Tensor<B, D>>), LowpError> {
        self.forward_microbatch(x, None)
    }

    pub fn forward_microbatch<const D: usize>(
        &self,
        x: Tensor<B, D>,
        is_first_microbatch: Option<bool>,
    ) -> std::result::Result<(Tensor<B, D>, Option<Tensor<B, D>>), LowpError> {
        let in_features = self.norm_weight.dims()[0];
        if x.dims()[D - 1] != in_features {
            return Err(LowpError::shape(
                "layernorm_linear input",
                format!("last dimension {}", x.dims()[D - 1]),
                format!("must equal in_features = {in_features}"),
            ));
        }
        let ln_out = self.normalize(x);
        let y = linear_forward(
            &self.lowp,
            &self.weight,
            self.bias.as_ref(),
            ln_out.clone(),
            is_first_microbatch,
        )?;
        Ok((y, self.return_layernorm_output.then_some(ln_out)))
    }
}

/// LayerNorm or RMSNorm over the last dimension as differentiable Burn ops (what
/// `return_layernorm_output` returns, so its gradient flows back through it). `· γ` and `+ β` are
/// the row-broadcast ops of `ops/row_broadcast.rs`, whose γ and β gradients sum over rows at
/// memory speed.
pub(crate) fn normalize<B: LowpLinear, const D: usize>(
    x: Tensor<B, D>,
    norm_weight: &Param<Tensor<B, 1>>,
    norm_bias: Option<&Param<Tensor<B, 1>>>,
    eps: f64,
    normalization: Normalization,
    zero_centered_gamma: bool,
) -> Tensor<B, D> {
    let last = D - 1;
    let normalized = match normalization {
        Normalization::LayerNorm => {
            let centered = x.clone() - x.mean_dim(last);
            let var = centered.clone().powi_scalar(2).mean_dim(last);
            centered / (var + eps).sqrt()
        }
        Normalization::RmsNorm => x.clone() / (x.powi_scalar(2).mean_dim(last) + eps).sqrt(),
    };
    let mut gamma = norm_weight.val();
    if zero_centered_gamma {
        gamma = gamma + 1.0;
    }
    let dims = normalized.dims();
    let features = dims[last];
    let rows = normalized.shape().num_elements() / features;
    let flat = normalized
        .reshape([rows, features])
        .into_primitive()
        .tensor();
    let mut y = B::lowp_mul_rows(flat, gamma.into_primitive().tensor());
    if let Some(beta) = norm_bias {
        y = B::lowp_add_bias(y, beta.val().into_primitive().tensor());
    }
    Tensor::<B, 2>::from_primitive(TensorPrimitive::Float(y)).reshape(dims)
}
