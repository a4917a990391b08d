//! Precision debugging: quantization-quality statistics (and, later, automatic GEMM switching).

pub mod stats;

pub use stats::QuantizationError;
