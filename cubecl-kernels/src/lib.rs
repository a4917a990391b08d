//! CubeCL quantization kernels for burn-lowp, generic over `cubecl::Runtime`, with no Burn types.
//!
//! One kernel family per file, each with the launch wrapper in `launch.rs`: `amax` (tensor amax and
//! the NVFP4 post-RHT amax, per row group), `fp8` (per-tensor current/delayed scaling), `fp8_block`
//! (1x128, 128x128), `mxfp8`, `nvfp4`, `swizzle`, `dequantize`. Grouped (MoE) matrices: the
//! layout of their row groups (`group_layout`, launcher beside it), grouped modes of the quantize
//! kernels, the per-group row scaling of grouped GEMM outputs (`row_scale`) the row moves
//! between packed and aligned layouts (`row_gather`) and a grouped GEMM output's per-group scale, bias and unpad (`group_epilogue`); the delayed-scaling history update (`delayed_scaling`, launcher beside it). In-kernel scalar
//! helpers live in `codec`, `scale`, `hadamard` and `random`. The host references they match bit
//! for bit are in the root crate under `src/format/`.
//!
//! Inputs are read as raw 32-bit words (one f32, or two f16/bf16, per word), so every runtime reads
//! every input dtype exactly, bf16 included. Codes are written packed into u32 words (the bytes in
//! memory are the row-major code bytes), block scales as bytes (MXFP8/NVFP4, needs 8-bit storage)
//! or f32 (FP8).
//!
//! Constants are float literals, never bit patterns passed through `f32::reinterpret`: CubeCL's
//! CUDA backend cannot bitcast a constant (it emits a `reinterpret_cast` of an rvalue).

pub mod attention;
pub mod cast;
pub mod grouped;
pub mod launch;
pub mod norm_act;
pub mod optim;
pub mod routing;
pub mod stats;
pub mod util;

pub use cast::codec::{ElemKind, Fp8Kind};
pub use cubecl;
pub use launch::*;

pub use attention::{heads, rope, softmax};
pub use cast::{amax, codec, delayed_scaling, dequantize, flags, fp8, fp8_block, gemm_block_scales, hadamard, mxfp8, nvfp4, random, scale, swizzle};
pub use grouped::{group_dbias_amax, group_epilogue, group_layout, row_gather, row_scale};
pub use norm_act::{activation, dbias_amax, norm};
pub use optim::{adamw, sum_squares};
pub use routing::token_routing;
pub use util::{buffers, pairs, partial_sums, reduce, stream_flags, zeroed};
