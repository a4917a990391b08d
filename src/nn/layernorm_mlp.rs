//! `LayerNormMlp`: a transformer block's feed-forward as one module, TE's `LayerNormMLP` (spec
//! section 10): LayerNorm or RMSNorm, fc1, one of TE's 12 activations, fc2, every GEMM quantized
//! per the recipe, run as one differentiable op (`ops/layernorm_mlp.rs`) whose norm and
//! activation passes are CubeCL kernels that also take the next quantizer's amax.
//!
//! Parameters use TE's names and layouts: `layer_norm_weight [H]` (1, or 0 with
//! `zero_centered_gamma`), `layer_norm_bias [H]` (LayerNorm only), `fc1_weight [F', H]` with
//! `F' = 2F` for gated activations, `fc1_bias [F']`, `fc2_weight [H, F]`, `fc2_bias [H]`.
//! Quantizer roles are `linear` roles named `<name>.fc1` / `<name>.fc2`.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use burn::config::Config;
use burn::module::{Module, Param};
use burn::optim::GradientsParams;
use burn::tensor::backend::Backend;
use burn::tensor::{Distribution, Tensor, TensorPrimitive};

use super::layernorm_linear::{normalize, Normalization};
use super::lowp_state::LowpState;
use super::weight_cache::WeightCache;
use crate::backend::NormSpec;
use crate::error::LowpError;
use crate::ops::{Activation, ActivationParams, ActivationSpec};
use crate::ops::layernorm_mlp::{MlpInputs, MlpOp, MlpWgrad, PendingMlpWgrad};
use crate::ops::LowpLinear;
use crate::quant::QuantizedTensor;
use crate::recipe::{BoundaryRoles, ModuleKind, Recipe, SlotLayout};

#[derive(Config, Debug)]
pub struct LayerNormMlpConfig {
    pub hidden_size: usize,
    pub ffn_hidden_size: usize,
    #[config(default = 1e-5)]
    pub eps: f64,
    #[config(default = true)]
    pub bias: bool,
    #[config(default = "Normalization::LayerNorm")]
    pub normalization: Normalization,
    #[config(default = false)]
    pub zero_centered_gamma: bool,
    #[config(default = "Activation::Gelu")]
    pub activation: Activation,
    /// clamped_swiglu's `limit`, `alpha` and `glu_linear_offset`.
    #[config(default = "ActivationParams::default()")]
    pub activation_params: ActivationParams,
    /// Also return the norm's output (then computed by differentiable Burn ops, so that a
    /// gradient through it reaches x).
    #[config(default = false)]
    pub return_layernorm_output: bool,
    /// Keep the wgrad GEMMs for `backward_dw` (TE's `delay_wgrad_compute`).
    #[config(default = false)]
    pub delay_wgrad_compute: bool,
    #[config(default = "String::new()")]
    pub name: String,
    /// fc1 and fc2 weights are drawn from N(0, init_std) (TE's default 0.023); biases start at 0.
    #[config(default = 0.023)]
    pub init_std: f64,
}

/// The quantized weights kept across micro-batches.
#[derive(Clone, Debug)]
struct MlpWeights<Q: crate::backend::LowpBackend> {
    fc1: QuantizedTensor<Q>,
    fc2: QuantizedTensor<Q>,
}

type PendingStore<Q> = Arc<Mutex<VecDeque<PendingMlpWgrad<Q>>>>;

#[derive(Module, Debug)]
pub struct LayerNormMlp<B: Backend> {
    pub layer_norm_weight: Param<Tensor<B, 1>>,
    /// LayerNorm only.
    pub layer_norm_bias: Option<Param<Tensor<B, 1>>>,
    pub fc1_weight: Param<Tensor<B, 2>>,
    pub fc1_bias: Option<Param<Tensor<B, 1>>>,
    pub fc2_weight: Param<Tensor<B, 2>>,
    pub fc2_bias: Option<Param<Tensor<B, 1>>>,
    pub lowp: LowpState<B>,
    /// Deferred wgrads (`delay_wgrad_compute`) until `backward_dw`.
    pending: WeightCache<B>,
    #[module(skip)]
    pub eps: f64,
    #[module(skip)]
    pub normalization: Normalization,
    #[module(skip)]
    pub zero_centered_gamma: bool,
    #[module(skip)]
    pub activation: Activation,
    #[module(skip)]
    pub activation_params: ActivationParams,
    #[module(skip)]
    pub return_layernorm_output: bool,
    #[module(skip)]
    pub delay_wgrad_compute: bool,
}

impl LayerNormMlpConfig {
    /// A config from JSON: `hidden_size` and `ffn_hidden_size`, and any other field above (the
    /// rest keep their defaults); `activation` by TE's name, e.g. `"swiglu"`. Unknown fields and
    /// bad values are errors naming the field.
    pub fn from_json(text: &str) -> Result<Self, LowpError> {
        let bad = |value: String, rule: &str| LowpError::invalid("layernorm_mlp config", value, rule);
        let given: serde_json::Value =
            serde_json::from_str(text).map_err(|e| bad(e.to_string(), "must be JSON"))?;
        let fields = given
            .as_object()
            .ok_or_else(|| bad(given.to_string(), "must be a JSON object"))?;
        let size = |name: &str| {
            fields
                .get(name)
                .and_then(|v| v.as_u64())
                .map(|v| v as usize)
                .ok_or_else(|| bad(format!("{name}: {:?}", fields.get(name)), "is required, a positive integer"))
        };
        let defaults = LayerNormMlpConfig::new(size("hidden_size")?, size("ffn_hidden_size")?);
        let mut full = serde_json::to_value(&defaults).map_err(|e| bad(e.to_string(), "serializes"))?;
        let known = full.as_object_mut().expect("a config serializes to an object");
        for (key, value) in fields {
            if !known.contains_key(key) {
                return Err(bad(
                    key.clone(),
                    "is not a LayerNormMlpConfig field",
                ));
            }
            known.insert(key.clone(), value.clone());
        }
        serde_json::from_value(full).map_err(|e| {
            bad(
                e.to_string(),
                "must be a LayerNormMlpConfig (activation one of gelu, geglu, glu, qgelu, qgeglu, \
                 relu, reglu, srelu, sreglu, silu, swiglu, clamped_swiglu)",
            )
        })
    }

    /// fc1's output width: `2 · ffn_hidden_size` for gated activations.
    pub fn fc1_out_features(&self) -> usize {
        if self.activation.is_gated() {
            2 * self.ffn_hidden_size
        } else {
            self.ffn_hidden_size
        }
    }

    fn check(&self) -> Result<(), LowpError> {
        for (name, value) in [
            ("hidden_size", self.hidden_size),
            ("ffn_hidden_size", self.ffn_hidden_size),
        ] {
            if value == 0 || value % 2 != 0 {
                return Err(LowpError::invalid(
                    &format!("layernorm_mlp {name}"),
                    value.to_string(),
                    "must be even and non-zero: the norm and activation kernels work on column \
                     pairs, and a gated activation splits fc1's output in two halves",
                ));
            }
        }
        if !(self.eps.is_finite() && self.eps > 0.0) {
            return Err(LowpError::invalid(
                "layernorm_mlp eps",
                self.eps.to_string(),
                "must be finite and > 0",
            ));
        }
        self.spec().check()
    }

    fn spec(&self) -> ActivationSpec {
        ActivationSpec {
            activation: self.activation,
            params: self.activation_params,
        }
    }

    pub fn init<B: Backend>(
        &self,
        recipe: &Recipe,
        device: &B::Device,
    ) -> Result<LayerNormMlp<B>, LowpError> {
        self.check()?;
        let (hidden, ffn, fc1_out) = (
            self.hidden_size,
            self.ffn_hidden_size,
            self.fc1_out_features(),
        );
        let layout = SlotLayout::new(ModuleKind::LayerNormMlp, &self.name, &BoundaryRoles::default());
        let lowp = LowpState::new(recipe, layout, &[(fc1_out, hidden), (hidden, ffn)], device)?;
        let weight = |shape: [usize; 2]| {
            Param::from_tensor(Tensor::random(
                shape,
                Distribution::Normal(0.0, self.init_std),
                device,
            ))
        };
        let zeros = |n: usize| Param::from_tensor(Tensor::zeros([n], device));
        Ok(LayerNormMlp {
            layer_norm_weight: Param::from_tensor(if self.zero_centered_gamma {
                Tensor::zeros([hidden], device)
            } else {
                Tensor::ones([hidden], device)
            }),
            layer_norm_bias: (self.normalization == Normalization::LayerNorm)
                .then(|| zeros(hidden)),
            fc1_weight: weight([fc1_out, hidden]),
            fc1_bias: self.bias.then(|| zeros(fc1_out)),
            fc2_weight: weight([hidden, ffn]),
            fc2_bias: self.bias.then(|| zeros(hidden)),
            lowp,
            pending: WeightCache::default(),
            eps: self.eps,
            normalization: self.normalization,
            zero_centered_gamma: self.zero_centered_gamma,
            activation: self.activation,
            activation_params: self.activation_params,
            return_layernorm_output: self.return_layernorm_output,
            delay_wgrad_compute: self.delay_wgrad_compute,
        })
    }
}

impl<B: LowpLinear> LayerNormMlp<B> {
    /// End of a training step: delayed-scaling scales are updated (no-op for other recipes).
    /// Errors only on delayed-scaling state that does not fit the module (a foreign record).
    pub fn end_step(&self) -> Result<(), LowpError> {
        self.lowp.end_step()
    }

    /// Returns the output, and the norm's output when `return_layernorm_output`.
    pub fn forward<const D: usize>(
        &self,
        x: Tensor<B, D>,
    ) -> Result<(Tensor<B, D>, Option<Tensor<B, D>>), LowpError> {
        self.forward_microbatch(x, None)
    }

    /// As `forward`; `Some(true)` quantizes both weights and keeps them, `Some(false)` reuses
    /// them (no weight quantization), `None` does not cache.
    pub fn forward_microbatch<const D: usize>(
        &self,
        x: Tensor<B, D>,
        is_first_microbatch: Option<bool>,
    ) -> Result<(Tensor<B, D>, Option<Tensor<B, D>>), LowpError> {
        let dims = x.dims();
        let hidden = self.layer_norm_weight.dims()[0];
        if dims[D - 1] != hidden {
            return Err(LowpError::shape(
                "layernorm_mlp input",
                format!("last dimension {}", dims[D - 1]),
                format!("must equal hidden_size = {hidden}"),
            ));
        }
        let rows: usize = dims[..D - 1].iter().product();
        let cached = match is_first_microbatch {
            Some(false) => self.lowp.cache.get::<MlpWeights<B::Quant>>(),
            _ => None,
        };
        let (fc1_cached, fc2_cached) = match cached {
            Some(w) => (Some(w.fc1), Some(w.fc2)),
            None => (None, None),
        };
        let op = MlpOp {
            norm: None,
            activation: ActivationSpec {
                activation: self.activation,
                params: self.activation_params,
            },
            fc1: self.lowp.linear_op_with(0, fc1_cached)?,
            fc2: self.lowp.linear_op_with(1, fc2_cached)?,
            wgrad: if self.delay_wgrad_compute {
                MlpWgrad::Deferred(self.pending_store())
            } else {
                MlpWgrad::Graph
            },
        };
        let prim = |t: Tensor<B, 1>| t.into_primitive().tensor();
        let (input, ln_out, op) = if self.return_layernorm_output {
            let ln = normalize(
                x,
                &self.layer_norm_weight,
                self.layer_norm_bias.as_ref(),
                self.eps,
                self.normalization,
                self.zero_centered_gamma,
            );
            (ln.clone(), Some(ln), op)
        } else {
            let norm = NormSpec {
                rms: self.normalization == Normalization::RmsNorm,
                eps: self.eps,
                zero_centered_gamma: self.zero_centered_gamma,
            };
            (x, None, MlpOp {
                norm: Some(norm),
                ..op
            })
        };
        let with_norm = op.norm.is_some();
        let inputs = MlpInputs {
            x: input.reshape([rows, hidden]).into_primitive().tensor(),
            gamma: with_norm.then(|| prim(self.layer_norm_weight.val())),
            beta: self
                .layer_norm_bias
                .as_ref()
                .filter(|_| with_norm)
                .map(|b| prim(b.val())),
            w1: self.fc1_weight.val().into_primitive().tensor(),
            b1: self.fc1_bias.as_ref().map(|b| prim(b.val())),
            w2: self.fc2_weight.val().into_primitive().tensor(),
            b2: self.fc2_bias.as_ref().map(|b| prim(b.val())),
        };
        let (y, fc1, fc2) = B::lowp_layernorm_mlp(inputs, op)?;
        if is_first_microbatch == Some(true) {
            self.lowp.cache.set(MlpWeights { fc1, fc2 });
        }
        let y = Tensor::<B, 2>::from_primitive(TensorPrimitive::Float(y)).reshape(dims);
        Ok((y, ln_out))
    }

    fn pending_store(&self) -> PendingStore<B::Quant> {
        if let Some(store) = self.pending.get::<PendingStore<B::Quant>>() {
            return store;
        }
        let store = PendingStore::<B::Quant>::default();
        self.pending.set(store.clone());
        store
    }

    /// Runs the wgrad GEMMs that `delay_wgrad_compute` kept and registers the weights' gradients
    /// in `grads` (several pending backward passes add up). A no-op when nothing is pending.
    pub fn backward_dw(&self, grads: &mut GradientsParams) -> Result<(), LowpError> {
        let Some(store) = self.pending.get::<PendingStore<B::Quant>>() else {
            return Ok(());
        };
        let pending: Vec<_> = store.lock().expect("wgrad store lock").drain(..).collect();
        let mut sums: [Option<Tensor<B::Quant, 2>>; 2] = [None, None];
        for p in &pending {
            let dw = Tensor::<B::Quant, 2>::from_primitive(TensorPrimitive::Float(p.run()?))
                .cast(burn::tensor::FloatDType::F32);
            let slot = &mut sums[p.gemm];
            *slot = Some(match slot.take() {
                Some(s) => s + dw,
                None => dw,
            });
        }
        for (gemm, sum) in sums.into_iter().enumerate() {
            let Some(sum) = sum else { continue };
            let weight = if gemm == 0 {
                &self.fc1_weight
            } else {
                &self.fc2_weight
            };
            grads.register::<B::Quant, 2>(weight.id, sum.cast(weight.val().dtype()));
        }
        Ok(())
    }
}

impl<B: Backend> LayerNormMlp<B> {
    /// Weight quantizations so far (each of fc1 and fc2 counts; cached micro-batches add none).
    pub fn weight_quantizations(&self) -> usize {
        self.lowp.weight_quantizations()
    }
}
