//! The MoE router: a high-precision (f32) linear layer scoring every expert for every token, the
//! top-k choice, the weights the chosen experts' outputs are mixed with, and the load-balancing
//! losses. Two scoring rules:
//! * `Softmax` (Megatron's default): `p = softmax(logits)`, the k largest `p` chosen, their `p`
//!   the weights (not renormalized);
//! * `Sigmoid` (DeepSeek-V3): `s = sigmoid(logits)`, the k largest `s + expert_bias` chosen (the
//!   bias only steers the choice), the chosen `s` renormalized to sum to 1. The bias is the
//!   aux-loss-free balancer: `update_expert_bias` moves it by `bias_update_rate` toward the mean
//!   load (up for underloaded experts, down for overloaded ones), on the device.
//!
//! Everything runs on the device (`ops::token_routing`): the top-k choice (one kernel on CubeCL
//! backends; Burn's sort would fall back to the host there), and the stable sort of the
//! assignments by expert, which gives the loads and every assignment's place in the experts'
//! batch.
//! Load-balancing loss (Switch / Megatron): `coeff · E · Σ_i f_i · P_i`, `f_i` the fraction of
//! the `T·k` assignments that went to expert i (no gradient), `P_i` the mean score of expert i over
//! the tokens; a perfectly balanced router gives exactly `coeff`. z-loss (ST-MoE):
//! `coeff · mean_t(logsumexp(logits_t)²)`.

use burn::config::Config;
use burn::module::{Module, Param};
use burn::tensor::activation::{sigmoid, softmax};
use burn::tensor::backend::Backend;
use burn::tensor::{Distribution, FloatDType, Int, Tensor, TensorCreationOptions};
use serde::{Deserialize, Serialize};

use crate::error::LowpError;
use crate::nn::fused::{self, Transposes};
use crate::backend::ops::rows::{reduce_rows, RowReduction};
use crate::ops::token_routing::{expert_positions, top_k};
use crate::ops::LowpLinear;
use crate::quant::state_tensor::OptionalState;
use crate::quant::StateTensor;

/// Rows per block of the router's column sums (`backend::ops::rows`).
const REDUCE_BLOCK: usize = 64;

/// How the router turns logits into scores.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ScoreFunction {
    Softmax,
    Sigmoid,
}

#[derive(Config, Debug)]
pub struct RouterConfig {
    pub hidden_size: usize,
    pub num_experts: usize,
    pub top_k: usize,
    #[config(default = "ScoreFunction::Softmax")]
    pub score_function: ScoreFunction,
    /// Load-balancing loss coefficient (0 disables it).
    #[config(default = 1e-2)]
    pub aux_loss_coeff: f64,
    /// z-loss coefficient (0 disables it).
    #[config(default = 0.0)]
    pub z_loss_coeff: f64,
    /// Step of the aux-loss-free expert bias (sigmoid scoring only).
    #[config(default = 1e-3)]
    pub bias_update_rate: f64,
    #[config(default = 0.02)]
    pub init_std: f64,
}

#[derive(Module, Debug)]
pub struct Router<B: Backend> {
    /// `[hidden, experts]`, f32.
    pub weight: Param<Tensor<B, 2>>,
    /// The aux-loss-free balancing bias `[experts]` (sigmoid scoring), state not trained.
    pub expert_bias: OptionalState<StateTensor<B, 1>>,
    #[module(skip)]
    pub top_k: usize,
    #[module(skip)]
    pub score_function: ScoreFunction,
    #[module(skip)]
    pub aux_loss_coeff: f64,
    #[module(skip)]
    pub z_loss_coeff: f64,
    #[module(skip)]
    pub bias_update_rate: f64,
}

/// What the router decided for a batch of T tokens.
#[derive(Debug, Clone)]
pub struct Routing<B: Backend> {
    /// Chosen experts `[T, k]`, best first.
    pub expert_index: Tensor<B, 2, Int>,
    /// Their mixing weights `[T, k]`, f32, differentiable.
    pub weights: Tensor<B, 2>,
    /// Assignments per expert `[E]` (the grouped GEMMs' `m_splits`).
    pub tokens_per_expert: Tensor<B, 1, Int>,
    /// Each assignment's place `[T·k]` when sorted by expert, stably (`ops::token_routing`).
    pub position: Tensor<B, 1, Int>,
    /// `aux_loss_coeff · E · Σ f_i P_i` (`[1]`, zero when the coefficient is 0).
    pub aux_loss: Tensor<B, 1>,
    /// `z_loss_coeff · mean(logsumexp²)` (`[1]`).
    pub z_loss: Tensor<B, 1>,
}

impl RouterConfig {
    pub fn init<B: Backend>(&self, device: &B::Device) -> Router<B> {
        let f32_on = TensorCreationOptions::new(device.clone()).with_dtype(FloatDType::F32.into());
        let weight = Tensor::<B, 2>::random(
            [self.hidden_size, self.num_experts],
            Distribution::Normal(0.0, self.init_std),
            f32_on.clone(),
        );
        Router {
            weight: Param::from_tensor(weight),
            expert_bias: (self.score_function == ScoreFunction::Sigmoid)
                .then(|| StateTensor::new(Tensor::zeros([self.num_experts], f32_on)))
                .into(),
            top_k: self.top_k,
            score_function: self.score_function,
            aux_loss_coeff: self.aux_loss_coeff,
            z_loss_coeff: self.z_loss_coeff,
            bias_update_rate: self.bias_update_rate,
        }
    }
}

impl<B: LowpLinear> Router<B> {
    /// Routes `x [T, hidden]` (any float dtype; the router computes in f32).
    pub fn forward(&self, x: Tensor<B, 2>) -> Result<Routing<B>, LowpError> {
        let [tokens, _] = x.dims();
        let experts = self.num_experts();
        let logits = fused::matmul(x.cast(FloatDType::F32), self.weight.val(), Transposes::default())?;
        let scores = match self.score_function {
            ScoreFunction::Softmax => softmax(logits.clone(), 1),
            ScoreFunction::Sigmoid => sigmoid(logits.clone()),
        };
        let selection = match self.expert_bias.as_ref() {
            Some(bias) => scores.clone().detach() + bias.value().reshape([1, experts]),
            None => scores.clone().detach(),
        };
        let expert_index = top_k(selection, self.top_k)?;
        let mut weights = scores.clone().gather(1, expert_index.clone());
        if self.score_function == ScoreFunction::Sigmoid {
            weights = weights.clone() / weights.sum_dim(1);
        }
        let (tokens_per_expert, position) = expert_positions(expert_index.clone(), experts)?;
        let device = logits.device();
        let zero = || Tensor::<B, 1>::zeros([1], TensorCreationOptions::new(device.clone()).with_dtype(FloatDType::F32.into()));
        let aux_loss = if self.aux_loss_coeff > 0.0 {
            let assignments = (tokens * self.top_k) as f64;
            let fraction = tokens_per_expert.clone().float().cast(FloatDType::F32) / assignments;
            // Blocks of rows first: Burn's `mean_dim(0)` over [tokens, E] ran E threads, each
            // looping over every token (about 0.2 ms per call on an H100).
            let mean_score = reduce_rows(scores, REDUCE_BLOCK, RowReduction::Sum)
                .reshape([experts])
                .div_scalar(tokens as f64);
            (fraction * mean_score).sum() * (self.aux_loss_coeff * experts as f64)
        } else {
            zero()
        };
        let z_loss = if self.z_loss_coeff > 0.0 {
            let max = logits.clone().max_dim(1).detach();
            let lse = (logits - max.clone()).exp().sum_dim(1).log() + max;
            lse.powi_scalar(2).mean() * self.z_loss_coeff
        } else {
            zero()
        };
        Ok(Routing {
            expert_index,
            weights,
            tokens_per_expert,
            position,
            aux_loss,
            z_loss,
        })
    }
}

impl<B: Backend> Router<B> {
    pub fn num_experts(&self) -> usize {
        self.weight.dims()[1]
    }

    /// DeepSeek-V3's aux-loss-free balancing (sigmoid scoring; a no-op otherwise): each expert's
    /// bias moves by `bias_update_rate` toward the mean load, `b_i += rate · sign(mean - load_i)`,
    /// with the loads of the step (`tokens_per_expert`, summed over micro-batches by the caller).
    pub fn update_expert_bias(&self, tokens_per_expert: Tensor<B, 1, Int>) {
        let Some(bias) = self.expert_bias.as_ref() else {
            return;
        };
        let load = tokens_per_expert.float().cast(FloatDType::F32);
        let mean = load.clone().mean();
        let step = (mean.expand(load.dims()) - load).sign() * self.bias_update_rate;
        bias.set(bias.value() + step);
    }
}
