//! burn-lowp: Transformer-Engine-class low-precision (FP8, MXFP8, NVFP4) training for Burn.
//!
//! * [`format`]: the reference quantizers, bit-exact with TE, that everything else is tested against.

pub mod debug;
pub mod error;
pub mod format;

pub use error::{LowpError, Result};
