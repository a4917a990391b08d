//! A small decoder-only MoE language model: token embedding -> N x (RMSNorm -> causal
//! self-attention with RoPE, its QKV and output projections burn-lowp `Linear`s -> RMSNorm -> MoE
//! feed-forward) -> RMSNorm -> head (a burn-lowp `Linear` named `lm_head`, or tied to the
//! embedding and run in high precision).
//!
//! GEMM names, which recipes match: `layers.<i>.attention.qkv`, `layers.<i>.attention.proj`,
//! `layers.<i>.moe.experts.fc1` / `.fc2`, `layers.<i>.moe.shared.fc1` / `.fc2`, `lm_head`.
//! The router, the embedding and the norms run in the backend's precision; attention's causal
//! softmax computes in f32 and rounds to it once (`nn::fused::causal_attention`).

use burn::config::Config;
use burn::module::Module;
use burn::nn::{
    Embedding, EmbeddingConfig, Initializer, RmsNorm, RmsNormConfig, RotaryEncoding,
};
use burn::tensor::activation::log_softmax;
use burn::tensor::backend::Backend;
use burn::tensor::{DType, Int, Tensor};

use super::layer::{MoeLayer, MoeLayerConfig};
use super::router::ScoreFunction;
use crate::dist::TokenAllToAll;
use crate::error::LowpError;
use crate::format::grouped::GroupScaling;
use crate::nn::{fused, rotary, Linear, LinearConfig, LowpState};
use crate::ops::LowpLinear;
use crate::recipe::{Recipe, RecipeAudit};

/// Largest vocabulary embedded as a one-hot product (its forward reads `vocab` values per output).
const ONE_HOT_VOCAB: usize = 4096;

/// The model's shape. Every field has a default (a tiny model that trains on a CPU in minutes),
/// so a config file names only what it changes.
#[derive(Config, Debug)]
pub struct MoeLmConfig {
    /// 256 for byte-level tokens.
    #[config(default = 256)]
    pub vocab_size: usize,
    #[config(default = 128)]
    pub hidden_size: usize,
    #[config(default = 2)]
    pub num_layers: usize,
    #[config(default = 4)]
    pub num_heads: usize,
    /// Each expert's intermediate width.
    #[config(default = 128)]
    pub ffn_hidden_size: usize,
    #[config(default = 8)]
    pub num_experts: usize,
    #[config(default = 2)]
    pub top_k: usize,
    #[config(default = "ScoreFunction::Softmax")]
    pub score_function: ScoreFunction,
    #[config(default = 1e-2)]
    pub aux_loss_coeff: f64,
    #[config(default = 0.0)]
    pub z_loss_coeff: f64,
    /// Intermediate width of a shared expert every token goes through (none when absent).
    #[config(default = "None")]
    pub shared_expert_ffn: Option<usize>,
    /// Longest sequence RoPE is precomputed for.
    #[config(default = 1024)]
    pub max_seq_len: usize,
    #[config(default = 10000.0)]
    pub rope_theta: f32,
    #[config(default = 1e-5)]
    pub norm_eps: f64,
    /// The head reuses the embedding matrix (in high precision) instead of its own `lm_head`.
    #[config(default = false)]
    pub tie_embeddings: bool,
    /// Standard deviation of the embedding and of every projection's weights.
    #[config(default = 0.02)]
    pub init_std: f64,
    /// FP8 per-tensor scales of the experts (current and delayed scaling): `per_group` (one per
    /// expert, TE's semantics) or `shared` (one for all experts of a GEMM, applied inside the
    /// grouped GEMM: no per-expert pass over its output). Other recipes ignore it.
    #[config(default = "GroupScaling::PerGroup")]
    pub expert_fp8_scales: GroupScaling,
}

#[derive(Module, Debug)]
pub struct CausalSelfAttention<B: Backend> {
    /// `hidden -> 3 · hidden` (Q, K, V).
    pub qkv: Linear<B>,
    pub proj: Linear<B>,
    #[module(skip)]
    pub num_heads: usize,
}

#[derive(Module, Debug)]
pub struct MoeDecoderLayer<B: Backend> {
    pub attention_norm: RmsNorm<B>,
    pub attention: CausalSelfAttention<B>,
    pub moe_norm: RmsNorm<B>,
    pub moe: MoeLayer<B>,
}

#[derive(Module, Debug)]
pub struct MoeLm<B: Backend> {
    pub embedding: Embedding<B>,
    pub layers: Vec<MoeDecoderLayer<B>>,
    pub norm: RmsNorm<B>,
    /// `None` when the head is tied to the embedding.
    pub lm_head: Option<Linear<B>>,
    pub rope: RotaryEncoding<B>,
}

/// A training forward's results.
#[derive(Debug, Clone)]
pub struct MoeLmOutput<B: Backend> {
    /// Mean next-token cross-entropy, `[1]` f32.
    pub lm_loss: Tensor<B, 1>,
    /// The layers' load-balancing and z losses summed, `[1]` f32.
    pub aux_loss: Tensor<B, 1>,
    /// Assignments per expert of each layer, `[E]` each (for the aux-loss-free bias update and
    /// for load statistics).
    pub tokens_per_expert: Vec<Tensor<B, 1, Int>>,
}

impl<B: Backend> MoeLmOutput<B> {
    /// What the optimizer minimises.
    pub fn loss(&self) -> Tensor<B, 1> {
        self.lm_loss.clone() + self.aux_loss.clone()
    }
}

impl MoeLmConfig {
    /// Checks what would otherwise fail deep inside a forward pass.
    pub fn validate(&self) -> Result<(), LowpError> {
        let positive = [
            ("vocab_size", self.vocab_size),
            ("hidden_size", self.hidden_size),
            ("num_layers", self.num_layers),
            ("num_heads", self.num_heads),
            ("ffn_hidden_size", self.ffn_hidden_size),
            ("num_experts", self.num_experts),
            ("max_seq_len", self.max_seq_len),
        ];
        for (what, value) in positive {
            if value == 0 {
                return Err(LowpError::invalid(format!("model.{what}"), value, "must be positive"));
            }
        }
        if self.hidden_size % self.num_heads != 0 {
            return Err(LowpError::invalid(
                "model.hidden_size",
                self.hidden_size,
                format!("must be a multiple of num_heads = {}", self.num_heads),
            ));
        }
        if (self.hidden_size / self.num_heads) % 2 != 0 {
            return Err(LowpError::invalid(
                "model.num_heads",
                self.num_heads,
                format!(
                    "the head size hidden_size / num_heads = {} must be even for RoPE",
                    self.hidden_size / self.num_heads
                ),
            ));
        }
        if self.top_k == 0 || self.top_k > self.num_experts {
            return Err(LowpError::invalid(
                "model.top_k",
                self.top_k,
                format!("must be between 1 and num_experts = {}", self.num_experts),
            ));
        }
        if !(self.init_std > 0.0) || !(self.norm_eps > 0.0) || !(self.rope_theta > 0.0) {
            return Err(LowpError::invalid(
                "model.init_std / norm_eps / rope_theta",
                format!("{} / {} / {}", self.init_std, self.norm_eps, self.rope_theta),
                "must be positive",
            ));
        }
        Ok(())
    }

    /// Builds the model with every GEMM quantized per `recipe` (shapes a recipe's quantizers
    /// cannot block are errors here, naming the GEMM).
    pub fn init<B: Backend>(&self, recipe: &Recipe, device: &B::Device) -> Result<MoeLm<B>, LowpError> {
        self.validate()?;
        let h = self.hidden_size;
        let linear = |inp: usize, out: usize, name: String| {
            LinearConfig::new(inp, out)
                .with_bias(false)
                .with_init_std(self.init_std)
                .with_name(name)
                .init::<B>(recipe, device)
        };
        let norm = || RmsNormConfig::new(h).with_epsilon(self.norm_eps).init::<B>(device);
        let layers = (0..self.num_layers)
            .map(|i| {
                Ok(MoeDecoderLayer {
                    attention_norm: norm(),
                    attention: CausalSelfAttention {
                        qkv: linear(h, 3 * h, format!("layers.{i}.attention.qkv"))?,
                        proj: linear(h, h, format!("layers.{i}.attention.proj"))?,
                        num_heads: self.num_heads,
                    },
                    moe_norm: norm(),
                    moe: MoeLayerConfig::new(h, self.ffn_hidden_size, self.num_experts, self.top_k)
                        .with_score_function(self.score_function)
                        .with_aux_loss_coeff(self.aux_loss_coeff)
                        .with_z_loss_coeff(self.z_loss_coeff)
                        .with_shared_expert_ffn(self.shared_expert_ffn)
                        .with_expert_fp8_scales(self.expert_fp8_scales)
                        .with_init_std(self.init_std)
                        .with_name(format!("layers.{i}.moe"))
                        .init(recipe, device)?,
                })
            })
            .collect::<Result<Vec<_>, LowpError>>()?;
        let lm_head = match self.tie_embeddings {
            true => None,
            false => Some(linear(h, self.vocab_size, "lm_head".into())?),
        };
        let model = MoeLm {
            embedding: EmbeddingConfig::new(self.vocab_size, h)
                .with_initializer(Initializer::Normal {
                    mean: 0.0,
                    std: self.init_std,
                })
                .init(device),
            layers,
            norm: norm(),
            lm_head,
            // Built in f64 and rounded once (Burn's init computes it in the backend's dtype).
            rope: rotary::rotary_encoding(self.max_seq_len, h / self.num_heads, self.rope_theta, device),
        };
        // Burn's `Embedding` draws its weights lazily, on first use; drawn here, right after the
        // layers, they come from the same place of the seeded stream whatever the caller draws
        // next (`init_expert_parallel` builds its local experts before any forward: the
        // embeddings it drew later differed from the one-GPU run's, H100 2026-11-28).
        let _ = model.embedding.weight.val();
        // A custom rule that matches none of the model's slots is an error here, not a run that
        // silently trains the default quantizer.
        model.recipe_audit(recipe)?;
        Ok(model)
    }
}

impl<B: LowpLinear> CausalSelfAttention<B> {
    /// `x [batch · seq, hidden]` -> same shape.
    pub fn forward(
        &self,
        x: Tensor<B, 2>,
        [batch, seq]: [usize; 2],
        rope: &RotaryEncoding<B>,
        is_first_microbatch: Option<bool>,
    ) -> Result<Tensor<B, 2>, LowpError> {
        let qkv = self.qkv.forward_microbatch(x, is_first_microbatch)?;
        // One op: the heads split (q and k rotated) and merged by one kernel each way around
        // the two batched products and one causal-softmax kernel (Burn's reshape, swap and
        // narrow would copy each part and, in backward, add three QKV-sized gradients).
        let context = fused::causal_self_attention(qkv, rope, [batch, seq], self.num_heads)?;
        self.proj.forward_microbatch(context, is_first_microbatch)
    }
}

impl<B: LowpLinear> MoeLm<B> {
    /// End of a training step: delayed-scaling updates in every GEMM, and each router's
    /// aux-loss-free bias moved by the loads its layer saw in the step (sigmoid routing).
    pub fn end_step(&self, tokens_per_expert: Option<Vec<Tensor<B, 1, Int>>>) -> Result<(), LowpError> {
        let mut loads = tokens_per_expert.map(|l| l.into_iter());
        for layer in &self.layers {
            layer.attention.qkv.end_step()?;
            layer.attention.proj.end_step()?;
            layer
                .moe
                .end_step(loads.as_mut().and_then(|l| l.next()))?;
        }
        if let Some(head) = &self.lm_head {
            head.end_step()?;
        }
        Ok(())
    }

    /// Logits `[batch · seq, vocab]` of `tokens [batch, seq]`, with the MoE layers' auxiliary
    /// losses and loads.
    pub fn forward(
        &self,
        tokens: Tensor<B, 2, Int>,
        is_first_microbatch: Option<bool>,
    ) -> Result<(Tensor<B, 2>, Tensor<B, 1>, Vec<Tensor<B, 1, Int>>), LowpError> {
        self.forward_with(tokens, is_first_microbatch, None)
    }

    /// `forward`, the MoE layers expert-parallel over `expert_parallel`'s group when given (the
    /// model then holds this rank's experts: `MoeLmConfig::init_expert_parallel`).
    pub fn forward_with(
        &self,
        tokens: Tensor<B, 2, Int>,
        is_first_microbatch: Option<bool>,
        expert_parallel: Option<&dyn TokenAllToAll<B>>,
    ) -> Result<(Tensor<B, 2>, Tensor<B, 1>, Vec<Tensor<B, 1, Int>>), LowpError> {
        let [batch, seq] = tokens.dims();
        let max_seq = self.rope.freq_complex.dims()[0];
        if seq > max_seq {
            return Err(LowpError::shape(
                "model tokens",
                format!("sequence length {seq}"),
                format!("must not exceed max_seq_len = {max_seq}"),
            ));
        }
        let hidden = self.embedding.weight.dims()[1];
        // Small (byte-level) vocabularies: the one-hot product's backward is one GEMM where
        // Burn's embedding scatters (`fused::one_hot_embedding`).
        let embedded = if self.embedding.weight.dims()[0] <= ONE_HOT_VOCAB {
            fused::one_hot_embedding(&self.embedding, tokens)?
        } else {
            self.embedding.forward(tokens)
        };
        let mut x = embedded.reshape([batch * seq, hidden]);
        let mut aux = Tensor::<B, 1>::zeros([1], &x.device()).cast(DType::F32);
        let mut loads = Vec::with_capacity(self.layers.len());
        for layer in &self.layers {
            let a = fused::rms_norm(&layer.attention_norm, x.clone())?;
            x = x + layer
                .attention
                .forward(a, [batch, seq], &self.rope, is_first_microbatch)?;
            let m = fused::rms_norm(&layer.moe_norm, x.clone())?;
            let (y, moe_aux) = match expert_parallel {
                Some(exchange) => layer.moe.forward_expert_parallel(m, is_first_microbatch, exchange)?,
                None => layer.moe.forward(m, is_first_microbatch)?,
            };
            let dtype = x.dtype();
            x = x + y.cast(dtype);
            aux = aux + moe_aux.loss;
            loads.push(moe_aux.tokens_per_expert);
        }
        let x = fused::rms_norm(&self.norm, x)?;
        let logits = match &self.lm_head {
            Some(head) => head.forward_microbatch(x, is_first_microbatch)?,
            None => fused::matmul(
                x,
                self.embedding.weight.val(),
                fused::Transposes { a: false, b: true },
            )?,
        };
        Ok((logits, aux, loads))
    }

    /// Next-token training loss of `tokens [batch, seq]` against `targets [batch, seq]` (the
    /// tokens shifted by one), the cross-entropy taken in f32.
    pub fn forward_loss(
        &self,
        tokens: Tensor<B, 2, Int>,
        targets: Tensor<B, 2, Int>,
        is_first_microbatch: Option<bool>,
    ) -> Result<MoeLmOutput<B>, LowpError> {
        self.forward_loss_with(tokens, targets, is_first_microbatch, None)
    }

    /// `forward_loss`, expert-parallel when `expert_parallel` is given (`forward_with`).
    pub fn forward_loss_with(
        &self,
        tokens: Tensor<B, 2, Int>,
        targets: Tensor<B, 2, Int>,
        is_first_microbatch: Option<bool>,
        expert_parallel: Option<&dyn TokenAllToAll<B>>,
    ) -> Result<MoeLmOutput<B>, LowpError> {
        if tokens.dims() != targets.dims() {
            return Err(LowpError::shape(
                "model targets",
                format!("{:?}", targets.dims()),
                format!("must equal the tokens' shape {:?}", tokens.dims()),
            ));
        }
        let (logits, aux_loss, tokens_per_expert) = self.forward_with(tokens, is_first_microbatch, expert_parallel)?;
        let [rows, _] = logits.dims();
        let log_p = log_softmax(logits.cast(DType::F32), 1);
        let lm_loss = log_p
            .gather(1, targets.reshape([rows, 1]))
            .mean()
            .neg();
        Ok(MoeLmOutput {
            lm_loss,
            aux_loss,
            tokens_per_expert,
        })
    }
}

impl<B: Backend> MoeLm<B> {
    /// Every GEMM's low-precision state, in a fixed order (checkpoints save their
    /// stochastic-rounding positions).
    /// What `recipe` assigned to every quantizer slot of the model, and the custom rules that
    /// matched none (an error unless the recipe allows it).
    pub fn recipe_audit(&self, recipe: &Recipe) -> Result<RecipeAudit, LowpError> {
        let states = self.lowp_states();
        let modules: Vec<_> = states.iter().map(|s| (&s.layout, &s.quantizers)).collect();
        RecipeAudit::new(recipe, &modules)
    }

    pub fn lowp_states(&self) -> Vec<&LowpState<B>> {
        let mut states = Vec::new();
        for layer in &self.layers {
            states.push(&layer.attention.qkv.lowp);
            states.push(&layer.attention.proj.lowp);
            states.push(&layer.moe.experts.fc1.lowp);
            states.push(&layer.moe.experts.fc2.lowp);
            if let Some(shared) = &layer.moe.shared {
                states.push(&shared.fc1.lowp);
                states.push(&shared.fc2.lowp);
            }
        }
        if let Some(head) = &self.lm_head {
            states.push(&head.lowp);
        }
        states
    }
}
