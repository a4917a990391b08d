//! `LowpTypes`: the types a backend adds to Burn's to run burn-lowp's ops. Only the device byte
//! buffer so far: quantized codes, scales and amaxes are raw bytes on the device, not Burn
//! tensors (Burn has no FP8/FP4 element types a kernel could write).

use burn::tensor::backend::Backend;

pub trait LowpTypes: Backend {
    /// A device buffer of raw bytes (codes, scales, amaxes).
    type Bytes: Clone + std::fmt::Debug + Send + Sync + 'static;
}
