//! Differentiable ops (a custom backward on `Autodiff<B>`) whose passes run the backend's ops,
//! most with quantized GEMMs. `LowpLinear` (`lowp_linear.rs`) is how each op reaches the backend
//! that quantizes and multiplies; `operand.rs` how one GEMM operand is quantized; the ops:
//! `linear.rs`, `grouped_linear.rs`, `layernorm_mlp.rs`, `norm_op.rs`, `activation_op.rs`,
//! `attention_op.rs`, `token_routing.rs`, `grouped_rows.rs`, `row_broadcast.rs`, and the
//! `DifferentiableOp`s of `differentiable.rs` (`rope_op.rs`, `softmax_op.rs`,
//! `batched_matmul.rs`). `delayed_update.rs` is the end-of-step update of FP8 delayed-scaling
//! state; `grad_tap.rs` hands a weight's gradient out of backward once it is complete (the hook
//! of data parallelism's overlapped gradient reduction).

pub mod activation_op;
pub mod attention_op;
pub mod batched_matmul;
mod delayed_update;
pub mod differentiable;
pub mod grad_tap;
pub mod grouped_linear;
pub mod grouped_rows;
pub mod layernorm_mlp;
pub mod linear;
pub mod lowp_linear;
pub mod norm_op;
pub mod operand;
pub mod rope_op;
pub mod row_broadcast;
pub mod softmax_op;
pub mod token_routing;

pub use crate::backend::activation::{Activation, ActivationParams, ActivationSpec};
pub use batched_matmul::BatchedMatmulOp;
pub use differentiable::DifferentiableOp;
pub use grouped_linear::{
    BackwardErrors, GroupedDelayed, GroupedLinearOp, GroupedQuantizer, GroupedWeight,
    InputRows, PendingWgrad, WgradTarget,
};
pub use grouped_rows::RowMove;
pub use layernorm_mlp::{MlpInputs, MlpOp, MlpWgrad, PendingMlpWgrad};
pub use linear::LinearOp;
pub use lowp_linear::LowpLinear;
pub use operand::{AmaxSink, DelayedSlot, OperandQuantizer, WeightOperand};
pub use rope_op::{RopeOp, RopePositions};
pub use softmax_op::CausalSoftmaxOp;
pub use token_routing::TokenRoutes;
