//! An MoE feed-forward layer: router -> dispatch (token rows into the experts' aligned batch, on
//! the device) -> SwiGLU experts on the grouped GEMMs -> combine with the router weights (f32),
//! plus an optional shared expert every token goes through (a SwiGLU MLP of `Linear`s).
//! Dropless: every assignment is computed, whatever the load. No host read anywhere in forward
//! (the grouped wgrad in backward reads the splits' host copy, requested when the layout was
//! made).

use burn::config::Config;
use burn::module::Module;
use burn::tensor::backend::Backend;
use burn::tensor::{Int, Tensor};

use super::experts::{SwigluExperts, SwigluExpertsConfig};
use super::router::{Router, RouterConfig, ScoreFunction};
use crate::error::LowpError;
use crate::nn::{fused, Linear, LinearConfig};
use crate::ops::token_routing::{combine, dispatch, token_routes};
use crate::ops::LowpLinear;
use crate::format::grouped::GroupScaling;
use crate::recipe::Recipe;

#[derive(Config, Debug)]
pub struct MoeLayerConfig {
    pub hidden_size: usize,
    /// Each expert's intermediate width.
    pub ffn_hidden_size: usize,
    pub num_experts: usize,
    pub top_k: usize,
    #[config(default = "ScoreFunction::Softmax")]
    pub score_function: ScoreFunction,
    #[config(default = 1e-2)]
    pub aux_loss_coeff: f64,
    #[config(default = 0.0)]
    pub z_loss_coeff: f64,
    /// Intermediate width of the shared expert (none when absent).
    #[config(default = "None")]
    pub shared_expert_ffn: Option<usize>,
    /// Role prefix (`<name>.experts.fc1`, `<name>.shared.fc1`, ...).
    #[config(default = "String::from(\"moe\")")]
    pub name: String,
    /// FP8 per-tensor scales of the experts: per expert or shared (`GroupedLinearConfig::fp8_scales`).
    #[config(default = "GroupScaling::PerGroup")]
    pub expert_fp8_scales: GroupScaling,
    /// Standard deviation of the router's, the experts' and the shared expert's weights.
    #[config(default = 0.02)]
    pub init_std: f64,
}

/// A SwiGLU MLP of `Linear`s (the shared expert).
#[derive(Module, Debug)]
pub struct SwigluMlp<B: Backend> {
    pub fc1: Linear<B>,
    pub fc2: Linear<B>,
}

#[derive(Module, Debug)]
pub struct MoeLayer<B: Backend> {
    pub router: Router<B>,
    pub experts: SwigluExperts<B>,
    pub shared: Option<SwigluMlp<B>>,
}

/// What a forward pass returns besides the output.
#[derive(Debug, Clone)]
pub struct MoeAux<B: Backend> {
    /// Load-balancing plus z-loss, `[1]` f32: add it to the training loss.
    pub loss: Tensor<B, 1>,
    /// Assignments per expert `[E]`.
    pub tokens_per_expert: Tensor<B, 1, Int>,
}

impl MoeLayerConfig {
    pub fn init<B: Backend>(
        &self,
        recipe: &Recipe,
        device: &B::Device,
    ) -> Result<MoeLayer<B>, LowpError> {
        if self.top_k == 0 || self.top_k > self.num_experts {
            return Err(LowpError::invalid(
                format!("{} top_k", self.name),
                self.top_k,
                format!("must be between 1 and num_experts = {}", self.num_experts),
            ));
        }
        let router = RouterConfig::new(self.hidden_size, self.num_experts, self.top_k)
            .with_score_function(self.score_function)
            .with_aux_loss_coeff(self.aux_loss_coeff)
            .with_z_loss_coeff(self.z_loss_coeff)
            .with_init_std(self.init_std)
            .init(device);
        let experts = SwigluExpertsConfig::new(
            self.num_experts,
            self.hidden_size,
            self.ffn_hidden_size,
        )
        .with_name(format!("{}.experts", self.name))
        .with_fp8_scales(self.expert_fp8_scales)
        .with_init_std(self.init_std)
        .init(recipe, device)?;
        let shared = match self.shared_expert_ffn {
            Some(f) => Some(SwigluMlp {
                fc1: LinearConfig::new(self.hidden_size, 2 * f)
                    .with_bias(false)
                    .with_name(format!("{}.shared.fc1", self.name))
                    .with_init_std(self.init_std)
                    .init(recipe, device)?,
                fc2: LinearConfig::new(f, self.hidden_size)
                    .with_bias(false)
                    .with_name(format!("{}.shared.fc2", self.name))
                    .with_init_std(self.init_std)
                    .init(recipe, device)?,
            }),
            None => None,
        };
        Ok(MoeLayer {
            router,
            experts,
            shared,
        })
    }
}

impl<B: LowpLinear> SwigluMlp<B> {
    pub fn forward(
        &self,
        x: Tensor<B, 2>,
        is_first_microbatch: Option<bool>,
    ) -> Result<Tensor<B, 2>, LowpError> {
        let h = self.fc1.forward_microbatch(x, is_first_microbatch)?;
        self.fc2.forward_microbatch(fused::swiglu(h)?, is_first_microbatch)
    }
}

impl<B: LowpLinear> MoeLayer<B> {
    /// `x [T, hidden]` -> `[T, hidden]` and the auxiliary loss and loads.
    pub fn forward(
        &self,
        x: Tensor<B, 2>,
        is_first_microbatch: Option<bool>,
    ) -> Result<(Tensor<B, 2>, MoeAux<B>), LowpError> {
        let [tokens, _] = x.dims();
        let k = self.router.top_k;
        let routing = self.router.forward(x.clone())?;
        let layout = self
            .experts
            .fc1
            .layout(routing.tokens_per_expert.clone(), tokens * k)?;
        let routes = token_routes::<B>(routing.position, &layout, k)?;
        let y = self.experts.forward_aligned(
            dispatch(x.clone(), &routes)?,
            &layout,
            is_first_microbatch,
        )?;
        let y = combine(y, routing.weights, &routes)?;
        let aux = MoeAux {
            loss: routing.aux_loss + routing.z_loss,
            tokens_per_expert: routing.tokens_per_expert,
        };
        self.with_shared_expert(y, x, is_first_microbatch, aux)
    }

    /// The routed experts' output `y` plus, when the layer has one, the shared expert's on `x`.
    pub(crate) fn with_shared_expert(
        &self,
        y: Tensor<B, 2>,
        x: Tensor<B, 2>,
        is_first_microbatch: Option<bool>,
        aux: MoeAux<B>,
    ) -> Result<(Tensor<B, 2>, MoeAux<B>), LowpError> {
        let y = match &self.shared {
            Some(shared) => y + shared.forward(x, is_first_microbatch)?,
            None => y,
        };
        Ok((y, aux))
    }
}

impl<B: LowpLinear> MoeLayer<B> {
    /// End of a training step: delayed-scaling updates, and the expert bias moved by the loads
    /// the step saw (sigmoid routing).
    pub fn end_step(&self, tokens_per_expert: Option<Tensor<B, 1, Int>>) -> Result<(), LowpError> {
        self.experts.end_step()?;
        if let Some(shared) = &self.shared {
            shared.fc1.end_step()?;
            shared.fc2.end_step()?;
        }
        if let Some(load) = tokens_per_expert {
            self.router.update_expert_bias(load);
        }
        Ok(())
    }
}
