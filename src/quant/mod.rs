//! Quantized tensors on a backend (and, with the recipes, the quantizers that make them).

pub mod quantized_tensor;

pub use quantized_tensor::{QuantizedStorage, QuantizedTensor, StorageScales};
