pub mod group_dbias_amax;
pub mod group_epilogue;
pub mod group_layout;
pub mod row_gather;
pub mod row_scale;
