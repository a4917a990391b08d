//! Differentiable ops whose backward passes run quantized GEMMs.

pub mod bias;
pub mod linear;

pub use linear::{AmaxSink, DelayedSlot, LinearOp, LowpLinear, OperandQuantizer, WeightOperand};
