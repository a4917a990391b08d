//! Differentiable ops whose backward passes run quantized GEMMs.

pub mod linear;
pub mod row_broadcast;
pub mod row_reduce;

pub use linear::{AmaxSink, DelayedSlot, LinearOp, LowpLinear, OperandQuantizer, WeightOperand};
