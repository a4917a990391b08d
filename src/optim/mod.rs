//! Optimizers whose per-parameter step is one kernel: `FusedAdamW`.

pub mod adamw;

pub use adamw::{AdamWStep, AdamWTensors, FusedAdamW, FusedAdamWConfig, FusedAdamWState};
