//! The signature types of the optimizer op (`OptimOps`): what one AdamW step of one parameter
//! takes besides the tensors (`AdamWStep`, Burn's `LearningRate` and the hyperparameters), and
//! what it returns (`AdamWTensors`).

use burn::optim::LearningRate;

/// What one step of one parameter takes besides the tensors.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdamWStep {
    pub lr: LearningRate,
    pub beta_1: f32,
    pub beta_2: f32,
    pub epsilon: f32,
    pub weight_decay: f32,
    /// 1 on the first step.
    pub time: usize,
    pub grad_clip_norm: Option<f32>,
}

impl AdamWStep {
    /// `1 - lr · weight_decay` as Burn forms it (f64, then the element type).
    pub fn decay(&self) -> f32 {
        (1.0 - self.lr * self.weight_decay as f64) as f32
    }

    /// `1 - β1^t` and `1 - β2^t` as Burn forms them (f32).
    pub fn corrections(&self) -> (f32, f32) {
        let t = self.time as i32;
        (1f32 - self.beta_1.powi(t), 1f32 - self.beta_2.powi(t))
    }
}

/// A step's results: the parameter in its dtype, the f32 moments (all flat, `[n]`).
pub struct AdamWTensors<T> {
    pub param: T,
    pub moment_1: T,
    pub moment_2: T,
}
