//! CubeCL quantization kernels for burn-lowp.
//!
//! Every kernel here is generic over `cubecl::Runtime` and knows nothing about Burn. Each kernel
//! family gets its own file (`amax.rs`, `fp8.rs`, `mxfp8.rs`, ...) together with its launch wrapper;
//! the host reference it must match bit for bit lives in the root crate under `src/format/`.
//!
//! The kernels arrive with issue 3; until then this crate only pins the CubeCL version so the
//! workspace resolves and builds with every backend feature.

pub use cubecl;
