//! burn-lowp: Transformer-Engine-class low-precision (FP8, MXFP8, NVFP4) training for Burn.
//!
//! * [`format`]: the reference quantizers, bit-exact with TE, that everything else is tested against.
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
