//! The training run's config file: `{ "model": {...}, "train": {...} }`. Every field has a
//! default, so a file names only what it changes; an unknown field or a wrong type is an error
//! naming its JSON path (`model.num_expert: unknown field ...`), as recipe files are.

use std::path::Path;

use burn::config::Config;
use serde::de::DeserializeOwned;
use serde::Serialize;
use burn_lowp::error::LowpError;
use burn_lowp::moe::MoeLmConfig;
use serde_json::Value;

/// Optimisation and data settings.
#[derive(Config, Debug)]
pub struct TrainConfig {
    #[config(default = 300)]
    pub steps: usize,
    /// Sequences per optimizer step (all micro-batches together).
    #[config(default = 8)]
    pub batch_size: usize,
    #[config(default = 64)]
    pub seq_len: usize,
    /// The batch is split into this many micro-batches whose gradients accumulate; the weights
    /// are quantized once per step (`is_first_microbatch`).
    #[config(default = 1)]
    pub micro_batches: usize,
    /// Peak learning rate (AdamW), reached after `warmup_steps`, then cosine decay to
    /// `min_lr_ratio · lr` at the last step.
    #[config(default = 3e-3)]
    pub lr: f64,
    #[config(default = 30)]
    pub warmup_steps: usize,
    #[config(default = 0.1)]
    pub min_lr_ratio: f64,
    #[config(default = 0.1)]
    pub weight_decay: f32,
    #[config(default = 0.9)]
    pub beta1: f32,
    #[config(default = 0.95)]
    pub beta2: f32,
    /// AdamW's epsilon. 1e-8 as PyTorch, Megatron and TE (not Burn's default 1e-5, which
    /// damps the updates of parameters with small gradients: `optim::FusedAdamWConfig`).
    #[config(default = 1e-8)]
    pub adam_eps: f32,
    /// Per-parameter gradient norm clipping (Burn's `GradientClipping::Norm`); none when absent.
    #[config(default = "Some(1.0)")]
    pub grad_clip_norm: Option<f32>,
    /// Seeds the weights and the data order.
    #[config(default = 42)]
    pub seed: u64,
    /// Losses are read from the device every `log_every` steps (one synchronisation per
    /// interval, not per step).
    #[config(default = 10)]
    pub log_every: usize,
    /// Save a checkpoint every this many steps (0: only at the end).
    #[config(default = 0)]
    pub checkpoint_every: usize,
    /// Data parallel runs: average the gradients over the ranks in FP32 (else BF16, half the
    /// bytes on the wire, each partial sum rounded to BF16).
    #[config(default = true)]
    pub grad_reduce_in_fp32: bool,
    /// Data parallel runs: all-reduce each layer weight's gradient as soon as backward has it,
    /// beside the rest of backward (Megatron's `overlap_grad_reduce`), in the step's last
    /// micro-batch; else every gradient after backward. The same sums either way.
    #[config(default = true)]
    pub overlap_grad_reduce: bool,
    /// Ranks that share one copy of the experts (expert parallelism): each rank of a group of
    /// this many consecutive ranks holds `num_experts / expert_parallel_size` experts and the
    /// MoE layers exchange tokens over the group. It must divide the world size and
    /// `model.num_experts`; 1: every rank holds every expert (data parallelism alone). With
    /// more than 1 the checkpoint keeps each EP rank's records apart (`checkpoint::save_sharded`).
    #[config(default = 1)]
    pub expert_parallel_size: usize,
}

impl TrainConfig {
    pub fn validate(&self) -> Result<(), LowpError> {
        for (what, value) in [
            ("steps", self.steps),
            ("batch_size", self.batch_size),
            ("seq_len", self.seq_len),
            ("micro_batches", self.micro_batches),
            ("log_every", self.log_every),
        ] {
            if value == 0 {
                return Err(LowpError::invalid(format!("train.{what}"), value, "must be positive"));
            }
        }
        if self.expert_parallel_size == 0 {
            return Err(LowpError::invalid("train.expert_parallel_size", 0, "must be positive"));
        }
        if self.batch_size % self.micro_batches != 0 {
            return Err(LowpError::invalid(
                "train.micro_batches",
                self.micro_batches,
                format!("must divide batch_size = {}", self.batch_size),
            ));
        }
        if !(self.adam_eps > 0.0 && self.adam_eps.is_finite()) {
            return Err(LowpError::invalid("train.adam_eps", self.adam_eps, "must be positive and finite"));
        }
        if !(self.lr > 0.0) || !(0.0..=1.0).contains(&self.min_lr_ratio) {
            return Err(LowpError::invalid(
                "train.lr / min_lr_ratio",
                format!("{} / {}", self.lr, self.min_lr_ratio),
                "lr must be positive and min_lr_ratio in [0, 1]",
            ));
        }
        Ok(())
    }

    /// Sequences per micro-batch.
    /// A data parallel run over `world_size` ranks splits each micro-batch's rows evenly over the
    /// ranks (the global batch is the config's): `batch_size / micro_batches` must be a multiple
    /// of the world size.
    /// With expert parallelism, `expert_parallel_size` must divide the world size too.
    pub fn check_world_size(&self, world_size: usize) -> Result<(), LowpError> {
        if self.expert_parallel_size > 1 && (world_size == 0 || world_size % self.expert_parallel_size != 0) {
            return Err(LowpError::invalid(
                "train.expert_parallel_size",
                self.expert_parallel_size,
                format!(
                    "must divide the world size {world_size} (ranks in groups of expert_parallel_size; a one-GPU run takes 1)"
                ),
            ));
        }
        let rows = self.micro_batch_size();
        if world_size == 0 || rows % world_size != 0 {
            return Err(LowpError::invalid(
                "WORLD_SIZE",
                world_size,
                format!(
                    "must divide the rows of a micro-batch (train.batch_size {} / train.micro_batches {} = {rows}): each rank takes an equal shard of the global batch",
                    self.batch_size, self.micro_batches
                ),
            ));
        }
        Ok(())
    }

    /// Rows of a micro-batch one of `world_size` ranks takes, and the first of them for `rank`.
    pub fn rank_rows(&self, rank: usize, world_size: usize) -> (usize, usize) {
        let rows = self.micro_batch_size() / world_size;
        (rank * rows, rows)
    }

    pub fn micro_batch_size(&self) -> usize {
        self.batch_size / self.micro_batches
    }

    /// Tokens per optimizer step.
    pub fn tokens_per_step(&self) -> usize {
        self.batch_size * self.seq_len
    }

    /// Linear warm-up, then cosine decay to `min_lr_ratio · lr` at the last step.
    pub fn learning_rate(&self, step: usize) -> f64 {
        if step < self.warmup_steps {
            return self.lr * (step + 1) as f64 / self.warmup_steps as f64;
        }
        let decay = (self.steps.saturating_sub(self.warmup_steps)).max(1) as f64;
        let progress = ((step - self.warmup_steps) as f64 / decay).min(1.0);
        let cosine = 0.5 * (1.0 + (std::f64::consts::PI * progress).cos());
        self.lr * (self.min_lr_ratio + (1.0 - self.min_lr_ratio) * cosine)
    }
}

/// The whole file.
#[derive(Debug, Clone)]
pub struct RunConfig {
    pub model: MoeLmConfig,
    pub train: TrainConfig,
}

impl Default for RunConfig {
    fn default() -> Self {
        RunConfig {
            model: MoeLmConfig::new(),
            train: TrainConfig::new(),
        }
    }
}

/// `defaults` with the fields of `given` replaced; unknown fields and wrong types are errors at
/// `path.<field>`.
fn overlay<T: Serialize + DeserializeOwned>(defaults: &T, given: &Value, path: &str) -> Result<T, LowpError> {
    let mut merged = serde_json::to_value(defaults).expect("a config serializes");
    let (Value::Object(fields), Some(given)) = (&mut merged, given.as_object()) else {
        return Err(LowpError::invalid(path, given, "must be a JSON object"));
    };
    for (key, value) in given {
        if !fields.contains_key(key) {
            let mut known: Vec<_> = fields.keys().cloned().collect();
            known.sort();
            return Err(LowpError::invalid(
                format!("{path}.{key}"),
                "unknown field",
                format!("known fields: {}", known.join(", ")),
            ));
        }
        fields.insert(key.clone(), value.clone());
    }
    let mut track = serde_path_to_error::Track::new();
    T::deserialize(serde_path_to_error::Deserializer::new(&merged, &mut track)).map_err(|e| {
        LowpError::invalid(format!("{path}.{}", track.path()), "JSON", e.to_string())
    })
}

impl RunConfig {
    pub fn from_json(text: &str) -> Result<Self, LowpError> {
        let value: Value = serde_json::from_str(text)
            .map_err(|e| LowpError::invalid("run config", "JSON", e.to_string()))?;
        let Some(sections) = value.as_object() else {
            return Err(LowpError::invalid("run config", value, "must be a JSON object"));
        };
        let defaults = RunConfig::default();
        let mut config = defaults.clone();
        for (key, section) in sections {
            match key.as_str() {
                "model" => config.model = overlay(&defaults.model, section, "model")?,
                "train" => config.train = overlay(&defaults.train, section, "train")?,
                other => {
                    return Err(LowpError::invalid(
                        other,
                        "unknown section",
                        "a run config has the sections \"model\" and \"train\"",
                    ))
                }
            }
        }
        config.model.validate()?;
        config.train.validate()?;
        if config.model.num_experts % config.train.expert_parallel_size != 0 {
            return Err(LowpError::invalid(
                "train.expert_parallel_size",
                config.train.expert_parallel_size,
                format!(
                    "must divide model.num_experts = {} (each rank of an expert-parallel group holds an equal block of experts)",
                    config.model.num_experts
                ),
            ));
        }
        if config.train.seq_len > config.model.max_seq_len {
            return Err(LowpError::invalid(
                "train.seq_len",
                config.train.seq_len,
                format!("must not exceed model.max_seq_len = {}", config.model.max_seq_len),
            ));
        }
        Ok(config)
    }

    pub fn load(path: impl AsRef<Path>) -> Result<Self, LowpError> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|e| LowpError::file(path, e))?;
        RunConfig::from_json(&text).map_err(|e| LowpError::file(path, e))
    }

    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(&serde_json::json!({
            "model": self.model,
            "train": self.train,
        }))
        .expect("a run config serializes")
    }
}
