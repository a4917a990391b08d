//! Runtime options passed to the quantize kernels as one u32, so that they do not multiply the
//! number of compiled kernel variants.

pub const ROWWISE: u32 = 1;
pub const COLUMNWISE: u32 = 2;
/// Write block scales in the GEMM-swizzled layout.
pub const SWIZZLED: u32 = 4;
