//! burn-lowp: Transformer-Engine-class low-precision (FP8, MXFP8, NVFP4) training for Burn.
//!
//! Modules, each importing only those listed before it (`.ci/check-imports` checks the layers):
//! * [`error`]: `LowpError`, the one error type; user input never panics.
//! * `deferred` (private): a value computed once, when first asked for.
//! * [`format`]: the reference quantizers, bit-exact with TE, that the rest is tested against.
//! * [`backend`]: `LowpBackend`, one ops trait per concern with Burn-op defaults; CubeCL, NdArray.
//! * [`quant`]: quantizer specs, the quantize call, delayed-scaling state.
//! * [`recipe`]: which quantizer every slot of every module gets (recipe files, roles).
//! * [`debug`]: precision debugging: tensor statistics, AutoswitchGemm.
//! * [`ops`]: differentiable ops (custom backward on `Autodiff`) over the backend's ops.
//! * [`optim`]: `FusedAdamW`, AdamW as one kernel per parameter.
//! * [`nn`]: Burn modules (Linear, LayerNormLinear, LayerNormMlp, GroupedLinear, fused blocks).
//! * [`moe`]: MoE building blocks (router, experts, layer) and the model the example trains.
//! * [`tensor_file`]: reading and writing safetensors files (checkpoints for the `lowp` CLI in
//!   `cli/`, the golden vectors of the tests).

pub mod backend;
pub mod debug;
mod deferred;
pub mod dist;
pub mod error;
pub mod format;
pub mod moe;
pub mod nn;
pub mod ops;
pub mod optim;
pub mod quant;
pub mod recipe;
pub mod tensor_file;

pub use error::{LowpError, Result};
