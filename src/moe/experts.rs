//! The experts of an MoE layer as a gated MLP (SwiGLU): `fc2(silu(gate) * up)` with
//! `[gate | up] = fc1(x)`, both GEMMs `GroupedLinear`s sharing one aligned token layout.
//! Padding rows stay zero through it (`silu(0) · 0 = 0`, biases only on token rows).

use burn::config::Config;
use burn::module::Module;
use burn::tensor::backend::Backend;
use burn::tensor::Tensor;

use crate::backend::GroupLayout;
use crate::error::LowpError;
use crate::format::grouped::GroupScaling;
use crate::nn::{fused, GroupedLinear, GroupedLinearConfig};
use crate::ops::LowpLinear;
use crate::recipe::Recipe;

#[derive(Config, Debug)]
pub struct SwigluExpertsConfig {
    pub num_experts: usize,
    pub hidden_size: usize,
    /// Each expert's intermediate width F (fc1 is `hidden -> 2F`, fc2 `F -> hidden`).
    pub ffn_hidden_size: usize,
    #[config(default = false)]
    pub bias: bool,
    /// Role prefix: the GEMMs are `<name>.fc1` and `<name>.fc2`.
    #[config(default = "String::from(\"experts\")")]
    pub name: String,
    /// FP8 per-tensor scales per expert or shared by the experts (`GroupedLinearConfig::fp8_scales`).
    #[config(default = "GroupScaling::PerGroup")]
    pub fp8_scales: GroupScaling,
    /// Weights drawn from N(0, init_std) (`GroupedLinearConfig::init_std`).
    #[config(default = 0.023)]
    pub init_std: f64,
}

#[derive(Module, Debug)]
pub struct SwigluExperts<B: Backend> {
    pub fc1: GroupedLinear<B>,
    pub fc2: GroupedLinear<B>,
}

impl SwigluExpertsConfig {
    pub fn init<B: Backend>(
        &self,
        recipe: &Recipe,
        device: &B::Device,
    ) -> Result<SwigluExperts<B>, LowpError> {
        let (e, h, f) = (self.num_experts, self.hidden_size, self.ffn_hidden_size);
        Ok(SwigluExperts {
            fc1: GroupedLinearConfig::new(e, h, 2 * f)
                .with_bias(self.bias)
                .with_name(format!("{}.fc1", self.name))
                .with_fp8_scales(self.fp8_scales)
                .with_init_std(self.init_std)
                .init(recipe, device)?,
            fc2: GroupedLinearConfig::new(e, f, h)
                .with_bias(self.bias)
                .with_name(format!("{}.fc2", self.name))
                .with_fp8_scales(self.fp8_scales)
                .with_init_std(self.init_std)
                .init(recipe, device)?,
        })
    }
}

impl<B: LowpLinear> SwigluExperts<B> {
    /// `x [layout.rows(), hidden]` in `layout`'s aligned layout -> `[layout.rows(), hidden]`.
    pub fn forward_aligned(
        &self,
        x: Tensor<B, 2>,
        layout: &GroupLayout<B::Quant>,
        is_first_microbatch: Option<bool>,
    ) -> Result<Tensor<B, 2>, LowpError> {
        let h = self.fc1.forward_aligned(x, layout, is_first_microbatch)?;
        self.fc2
            .forward_aligned(fused::swiglu(h)?, layout, is_first_microbatch)
    }
}

impl<B: LowpLinear> SwigluExperts<B> {
    /// End of a training step: both GEMMs' delayed-scaling updates.
    pub fn end_step(&self) -> Result<(), LowpError> {
        self.fc1.end_step()?;
        self.fc2.end_step()
    }
}
