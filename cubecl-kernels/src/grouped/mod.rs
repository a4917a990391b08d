//! Grouped (MoE) matrices, whose rows fall into groups (one per expert):
//! - `group_layout`: the layout of the groups (packed and aligned rows) computed on the device
//!   from the split sizes, and `RowGroups`, the groups as the grouped kernels take them;
//! - `row_gather`: row moves between the packed and aligned layouts, and `RowGather`, the row
//!   map the grouped casts read through;
//! - `row_scale`, `group_epilogue`: a grouped GEMM's output scaled per group (and biased,
//!   unpadded);
//! - `group_dbias_amax`: the per-group bias gradient and amax of a grouped grad-output.

pub mod group_dbias_amax;
pub mod group_epilogue;
pub mod group_layout;
pub mod row_gather;
pub mod row_scale;
