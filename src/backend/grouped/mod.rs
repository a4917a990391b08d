//! Grouped (MoE) matrices: the types the grouped ops take (`GroupedOps`): where the groups lie
//! and how a token batch is laid out (`groups.rs`), a grouped GEMM's operands and paths
//! (`gemm.rs`), and how a grouped layer's token rows lie and move (`rows.rs`). The layouts are
//! specified in `format::grouped`.

mod gemm;
mod groups;
mod rows;

pub use crate::format::grouped::{aligned_rows, RowGroup, GROUP_ALIGN};
pub use gemm::{
    grouped_output_shape, per_group_pays, BatchedOperands, GroupedGemmPath, GroupedOperand,
};
pub(crate) use gemm::check_grouped_options;
pub use groups::{
    check_splits_shape, group_view, host_group_layout, GroupLayout, Groups, HostGroups,
};
pub use rows::{check_packed_rows, GroupEpilogue, GroupedFp8Scaling, InputRows, RowMove};

pub use super::host_copy::HostCopy;
// The Burn-op definitions of the grouped ops, where callers knew them.
pub use super::ops::grouped::{
    dequantize_group_by_group, group_epilogue_by_ops, grouped_column_sum_per_group,
    grouped_dbias_after_move, grouped_gemm_per_group, quantize_fp8_padded_after_move,
};
