//! `Linear`: `y = x · Wᵀ + b` with every GEMM (fprop, dgrad, wgrad) quantized as its recipe says.
//! The weight is `[out_features, in_features]`, TE's layout.
//!
//! A recipe is given when the module is built (`LinearConfig::init`); there is no global autocast
//! scope. `forward_microbatch(x, Some(true))` quantizes the weight and caches it, `Some(false)`
//! reuses the cache (no new weight quantization), `None` does not cache. With delayed scaling, call
//! `end_step` once per optimizer step.

use burn::config::Config;
use burn::module::{Module, Param};
use burn::tensor::backend::Backend;
use burn::tensor::{Distribution, Tensor, TensorPrimitive};

use super::lowp_state::LowpState;
use crate::error::LowpError;
use crate::ops::{grad_tap, LowpLinear};
use crate::recipe::{BoundaryRoles, ModuleKind, Recipe, SlotLayout};

#[derive(Config, Debug)]
pub struct LinearConfig {
    pub in_features: usize,
    pub out_features: usize,
    #[config(default = true)]
    pub bias: bool,
    /// The module's name in quantizer roles (recipes can match it).
    #[config(default = "String::new()")]
    pub name: String,
    /// Weights are drawn from N(0, init_std) (TE's default 0.023); biases start at 0.
    #[config(default = 0.023)]
    pub init_std: f64,
}

#[derive(Module, Debug)]
pub struct Linear<B: Backend> {
    pub weight: Param<Tensor<B, 2>>,
    pub bias: Option<Param<Tensor<B, 1>>>,
    pub lowp: LowpState<B>,
}

impl LinearConfig {
    pub fn init<B: Backend>(
        &self,
        recipe: &Recipe,
        device: &B::Device,
    ) -> std::result::Result<Linear<B>, LowpError> {
        self.init_with(recipe, &BoundaryRoles::default(), device)
    }

    /// As `init`, with the roles a parent gives the output and grad_input slots.
    pub fn init_with<B: Backend>(
        &self,
        recipe: &Recipe,
        boundary: &BoundaryRoles,
        device: &B::Device,
    ) -> std::result::Result<Linear<B>, LowpError> {
        let layout = SlotLayout::new(ModuleKind::Linear, &self.name, boundary);
        let lowp = LowpState::new(
            recipe,
            layout,
            &[(self.out_features, self.in_features)],
            device,
        )?;
        let weight = Tensor::random(
            [self.out_features, self.in_features],
            Distribution::Normal(0.0, self.init_std),
            device,
        );
        Ok(Linear {
            weight: Param::from_tensor(weight),
            bias: self
                .bias
                .then(|| Param::from_tensor(Tensor::zeros([self.out_features], device))),
            lowp,
        })
    }
}

/// `x · Wᵀ + b` on the last dimension of `x`, the rest flattened into rows, through the
/// quantized op; shared by `Linear` and `LayerNormLinear`.
pub(crate) fn linear_forward<B: LowpLinear, const D: usize>(
    lowp: &LowpState<B>,
    weight: &Param<Tensor<B, 2>>,
    bias: Option<&Param<Tensor<B, 1>>>,
    x: Tensor<B, D>,
    is_first_microbatch: Option<bool>,
) -> std::result::Result<Tensor<B, D>, LowpError> {
    let dims = x.dims();
    let [out_features, in_features] = weight.dims();
    if dims[D - 1] != in_features {
        return Err(LowpError::shape(
            "linear input",
            format!("last dimension {}", dims[D - 1]),
            format!("must equal in_features = {in_features}"),
        ));
    }
    let rows: usize = dims[..D - 1].iter().product();
    let x = x.reshape([rows, in_features]);
    let op = lowp.linear_op(0, is_first_microbatch)?;
    // Through the installed gradient tap, if any (data parallelism's overlapped reduction).
    let w = grad_tap::tapped(weight, &x);
    // The bias goes into the fprop GEMM (cuBLASLt's epilogue on CUDA).
    let (y, quantized_weight) = B::lowp_linear(
        x.into_primitive().tensor(),
        w.into_primitive().tensor(),
        bias.map(|b| b.val().into_primitive().tensor()),
        op,
    )?;
    lowp.keep_weight(quantized_weight, is_first_microbatch);
    let y = Tensor::<B, 2>::from_primitive(TensorPrimitive::Float(y));
    let mut out = dims;
    out[D - 1] = out_features;
    Ok(y.reshape(out))
}

impl<B: LowpLinear> Linear<B> {
    /// End of a training step: delayed-scaling scales are updated (no-op for other recipes).
    /// Errors only on delayed-scaling state that does not fit the module (a foreign record).
    pub fn end_step(&self) -> Result<(), LowpError> {
        self.lowp.end_step()
    }

    pub fn forward<const D: usize>(
        &self,
        x: Tensor<B, D>,
    ) -> std::result::Result<Tensor<B, D>, LowpError> {
        self.forward_microbatch(x, None)
    }

    pub fn forward_microbatch<const D: usize>(
        &self,
        x: Tensor<B, D>,
        is_first_microbatch: Option<bool>,
    ) -> std::result::Result<Tensor<B, D>, LowpError> {
        linear_forward(
            &self.lowp,
            &self.weight,
            self.bias.as_ref(),
            x,
            is_first_microbatch,
        )
    }
}

impl<B: Backend> Linear<B> {
    /// Weight quantizations so far (cached micro-batches do not add).
    pub fn weight_quantizations(&self) -> usize {
        self.lowp.weight_quantizations()
    }
}
