//! Quantized tensors on a backend, the quantizers that make them, and delayed-scaling state.

pub mod delayed;
pub mod grouped;
pub mod quantizer;
pub mod spec;
pub mod state_tensor;

pub use delayed::{AmaxComputeAlgo, DelayedCast, DelayedScalingConfig, DelayedScalingState, Fp8Recipe};
pub use crate::backend::quantized::{
    QuantizedParts, QuantizedStorage, QuantizedTensor, QuantizedTensorParts, ScaleParts, Storage,
    StorageScales,
};
pub use quantizer::{quantize, QuantizeCall};
pub use spec::{ColumnwiseSource, IdentityDtype, QuantizerSpec};
pub use state_tensor::StateTensor;
