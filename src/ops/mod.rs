//! Differentiable ops whose backward passes run quantized GEMMs.

pub mod activation_op;
pub mod attention_op;
pub mod batched_matmul;
mod delayed_update;
pub mod differentiable;
pub mod grouped_linear;
pub mod grouped_rows;
pub mod layernorm_mlp;
pub mod linear;
pub mod norm_op;
pub mod rope_op;
pub mod softmax_op;
pub mod token_routing;
pub mod row_broadcast;

pub use grouped_linear::{
    BackwardErrors, GroupedDelayed, GroupedLinearOp, GroupedQuantizer, GroupedWeight,
    InputRows, PendingWgrad, WgradTarget,
};
pub use grouped_rows::RowMove;
pub use batched_matmul::BatchedMatmulOp;
pub use differentiable::DifferentiableOp;
pub use rope_op::{RopeOp, RopePositions};
pub use softmax_op::CausalSoftmaxOp;
pub use token_routing::TokenRoutes;
pub use layernorm_mlp::{MlpInputs, MlpOp, MlpWgrad, PendingMlpWgrad};
pub use crate::backend::activation::{Activation, ActivationParams, ActivationSpec};
pub use linear::{AmaxSink, DelayedSlot, LinearOp, LowpLinear, OperandQuantizer, WeightOperand};
