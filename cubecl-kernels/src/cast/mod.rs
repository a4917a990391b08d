//! Casts to the low-precision formats and back, each format's kernels beside their launcher:
//! - `fp8` (per-tensor current or delayed scaling, grouped, through a row map or with an
//!   activation prologue), `fp8_block` (1x128 and 128x128 blocks), `mxfp8`, `nvfp4`: one folder
//!   per format, one file per kernel, the launcher that picks one in its `mod.rs`;
//! - `amax`: the amax passes before FP8 current scaling and NVFP4;
//! - `dequantize`: every format back to f32;
//! - `swizzle`, `gemm_block_scales`: block scales in the layouts the GEMMs read;
//! - `delayed_scaling`: the end-of-step update of a module's amax history and scales;
//! - what the casts share: their outputs (`output`, with the `CastOutputs` argument of the
//!   block-scaled kernels), the launchers' runtime choices (`kernel_choice`), the kernels' run-time
//!   flags (`flags`), and the in-kernel codecs, scale rules, Hadamard transform and random
//!   streams (`codec`, `scale`, `hadamard`, `random`), each the twin of a host reference in the
//!   root crate's `src/format/`.

pub mod amax;
pub mod codec;
pub mod delayed_scaling;
pub mod dequantize;
pub mod flags;
pub mod fp8;
pub mod fp8_block;
pub mod gemm_block_scales;
pub mod hadamard;
pub mod kernel_choice;
pub mod mxfp8;
pub mod nvfp4;
pub mod output;
pub mod random;
pub mod scale;
pub mod swizzle;
