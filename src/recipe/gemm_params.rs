//! How FP8 per-tensor GEMMs accumulate: TE's `MMParams` (`fp8_gemm_fprop`, `fp8_gemm_dgrad`,
//! `fp8_gemm_wgrad` of `Float8CurrentScaling`). Hopper's FP8 tensor cores accumulate in a
//! narrower-than-f32 accumulator; cuBLASLt's split ("2x") accumulator promotes partial sums to
//! f32 every few steps of the reduction (accurate, ~5-18 % slower), fast accumulation does not.
//! TE uses fast accumulation for fprop and the split accumulator for dgrad and wgrad (gradients
//! are summed over long token reductions); FP8 block scaling always splits.

use serde::{Deserialize, Serialize};

use crate::backend::GemmKind;

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

/// Whether each GEMM of a module accumulates FP8 per-tensor products with the split
/// accumulator (what a recipe's `fp8_gemm_*` fields resolve to; other formats ignore it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SplitAccumulator {
    pub fprop: bool,
    pub dgrad: bool,
    pub wgrad: bool,
}

impl Default for SplitAccumulator {
    /// TE's module defaults (`_2X_ACC_FPROP = False`, `_2X_ACC_DGRAD = _2X_ACC_WGRAD = True`).
    fn default() -> Self {
        SplitAccumulator {
            fprop: false,
            dgrad: true,
            wgrad: true,
        }
    }
}

impl SplitAccumulator {
    pub fn from_params(fprop: MmParams, dgrad: MmParams, wgrad: MmParams) -> Self {
        SplitAccumulator {
            fprop: fprop.use_split_accumulator,
            dgrad: dgrad.use_split_accumulator,
            wgrad: wgrad.use_split_accumulator,
        }
    }

    /// The setting of GEMM `kind`.
    pub fn of(&self, kind: GemmKind) -> bool {
        match kind {
            GemmKind::Fprop => self.fprop,
            GemmKind::Dgrad => self.dgrad,
            GemmKind::Wgrad => self.wgrad,
        }
    }
}
