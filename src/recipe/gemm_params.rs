//! How FP8 per-tensor GEMMs accumulate: TE's `MMParams` (`fp8_gemm_fprop`, `fp8_gemm_dgrad`,
//! `fp8_gemm_wgrad` of `Float8CurrentScaling`). Hopper's FP8 tensor cores accumulate in a
//! narrower-than-f32 accumulator; cuBLASLt's split ("2x") accumulator promotes partial sums to
//! f32 every few steps of the reduction (accurate, ~5-18 % slower), fast accumulation does not.
//! TE uses fast accumulation for fprop and the split accumulator for dgrad and wgrad (gradients
//! are summed over long token reductions); FP8 block scaling always splits.

use serde::{Deserialize, Serialize};

pub use crate::backend::SplitAccumulator;

/// TE's `MMParams` of one GEMM.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MmParams {
    pub use_split_accumulator: bool,
}

pub(crate) fn fast() -> MmParams {
    MmParams {
        use_split_accumulator: false,
    }
}

pub(crate) fn split() -> MmParams {
    MmParams {
        use_split_accumulator: true,
    }
}

/// (`SplitAccumulator` itself is the backend's: `GemmKind::split_accumulator` applies its default.)
impl SplitAccumulator {
    pub fn from_params(fprop: MmParams, dgrad: MmParams, wgrad: MmParams) -> Self {
        SplitAccumulator {
            fprop: fprop.use_split_accumulator,
            dgrad: dgrad.use_split_accumulator,
            wgrad: wgrad.use_split_accumulator,
        }
    }
}
