//! CubeCL kernels for burn-lowp, generic over `cubecl::Runtime`, with no Burn types. Each file
//! holds one kernel family, its `#[cube]` kernels first and their launchers beside them
//! (validate shapes, allocate outputs, pick cube counts, launch; they take and return CubeCL
//! handles). The host references they match bit for bit are in the root crate under
//! `src/format/`.
//!
//! Concern modules:
//! - [`cast`]: quantization to FP8 (per-tensor current/delayed scaling, 1x128 and 128x128
//!   blocks), MXFP8 and NVFP4, the amax passes before them, dequantization, block-scale layouts
//!   for the GEMMs (swizzle, cuBLASLt's FP8 block scales), the delayed-scaling history update,
//!   and the in-kernel codecs, scale rules, Hadamard transform and random streams they share.
//! - [`grouped`]: grouped (MoE) matrices: the layout of their row groups, row moves between the
//!   packed and aligned layouts, a grouped GEMM output's row scaling and epilogue, the per-group
//!   bias gradient and amax.
//! - [`norm_act`]: LayerNormMLP's LayerNorm / RMSNorm and activations, forward and backward, and
//!   a Linear's bias gradient with its grad-output's amax.
//! - [`attention`]: the head layout of a fused QKV projection, RoPE and the causal softmax.
//! - [`routing`]: an MoE layer's token routing (top-k, expert positions, dispatch, combine).
//! - [`optim`]: the fused AdamW step and the gradient norm's sum of squares.
//! - [`stats`]: tensor statistics for the precision debug tools.
//! - [`util`]: what every family shares: the error type, matrix descriptors, buffers (fill,
//!   copy, zeroed accumulators), cube counts, element reading and pairs, cube-wide reductions,
//!   column partial sums, and the stream flags that order CubeCL's stream against cuBLASLt.
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
pub mod norm_act;
pub mod optim;
pub mod routing;
pub mod stats;
pub mod util;

pub use cast::codec::Fp8Kind;
pub use cubecl;
pub use util::elements::ElemKind;

// ---------------------------------------------------------------------------------------------
// Paths kept for callers; to be removed once callers use the concern modules.
//
// The crate used to be one flat folder of kernel files with every launcher in `launch.rs`,
// glob-exported at the root. The root crate still reaches its items by those paths
// (`burn_lowp_kernels::quantize_fp8_tensor`, `kernels::norm::norm_forward`, ...); these
// re-exports keep them working until it moves to the paths above.
// ---------------------------------------------------------------------------------------------

// The former modules that callers name, where they now live.
pub use attention::{heads, rope, softmax};
pub use cast::{delayed_scaling, fp8, gemm_block_scales, scale};
pub use grouped::{group_dbias_amax, group_epilogue, group_layout, row_gather, row_scale};
pub use norm_act::dbias_amax;
pub use optim::{adamw, sum_squares};
pub use util::stream_flags;

/// The former `activation` module, which also held the activation functions.
pub mod activation {
    pub use crate::norm_act::act_fn::*;
    pub use crate::norm_act::activation::*;
}

/// The former `norm` module, which also held `WordMatrix`.
pub mod norm {
    pub use crate::norm_act::norm::*;
    pub use crate::util::matrix::WordMatrix;
}

/// The former `token_routing` module, now one file per step.
pub mod token_routing {
    pub use crate::routing::combine_rows::{combine_rows, combine_rows_backward, combine_weights_grad};
    pub use crate::routing::expert_positions::expert_positions;
    pub use crate::routing::route_rows::route_rows;
    pub use crate::routing::top_k::top_k;
}

// The former `launch.rs`, glob-exported at the root.
pub use cast::amax::{amax, amax_with_rht, group_amax, group_amax_gathered};
pub use cast::dequantize::{
    dequantize_fp8, dequantize_fp8_grouped, dequantize_mxfp8, dequantize_nvfp4, Fp8Scales,
};
pub use cast::fp8::{
    quantize_fp8_tensor, quantize_fp8_tensor_activated, quantize_fp8_tensor_activated_current,
    quantize_fp8_tensor_gathered, StateColumns, TensorScaling,
};
pub use cast::fp8_block::quantize_fp8_block;
pub use cast::kernel_choice::{fp8_encoder, force_integer_fp8_encoder, force_tile_quantize_kernels};
pub use cast::mxfp8::{mxfp8_scale_shapes, quantize_mxfp8};
pub use cast::nvfp4::{nvfp4_scale_shapes, quantize_nvfp4, Nvfp4Options};
pub use cast::output::{DirectionOutput, Directions, QuantizeOutput};
pub use cast::swizzle::{swizzle, unswizzle};
pub use grouped::group_layout::RowGroups;
pub use grouped::row_gather::RowGather;
pub use util::buffers::{copy, copy_range, fill, filled, spread_words};
pub use util::error::KernelError;
pub use util::matrix::InputMatrix;
pub use util::stream_flags::{signal_flag, wait_flag};
