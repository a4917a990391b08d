//! `LowpBackend`: the operations burn-lowp adds to a Burn backend, as one ops trait per concern
//! (`ops/`: quantize, GEMM, grouped, routing, norm, activation, attention, optimizer, statistics,
//! device bytes), each default body (the Burn-op reference) beside its trait, and `LowpBackend`
//! the marker that asks for all of them. Implemented for `CubeBackend<R, ..>` (the CubeCL
//! kernels, on CUDA or wgpu; `cube/`, with CUDA's cuBLASLt and sm90 kernels in `cuda/`) and for
//! `NdArray` (the reference quantizers; `ndarray/`), so modules written against
//! `B: LowpBackend` run on both. The types the ops take live here too (`quantized/`,
//! `grouped/`, `gemm.rs`, ...): nothing in the backend imports the layers above it.

#[cfg(any(feature = "wgpu", feature = "cuda"))]
pub mod cube;
#[cfg(feature = "cuda")]
pub mod cuda;
#[cfg(feature = "ndarray")]
pub mod ndarray;

pub mod activation;
pub mod attention;
pub mod device;
pub mod exact_record;
pub mod gemm;
pub mod gemm_profile;
pub mod gemm_tuning;
pub mod grouped;
pub mod host_copy;
pub mod host_sync;
pub mod norm;
pub mod ops;
pub mod optim;
pub mod quantized;
pub mod routing;

pub use activation::{Activation, ActivationOutput, ActivationParams, ActivationSpec};
pub use attention::{HeadLayout, RopePositions};
pub use gemm::{GemmCall, GemmKind, GemmOptions, GemmPath, SplitAccumulator, Transposes};
pub use gemm_profile::{gemm_profile, set_gemm_profiling, GemmPhase};
pub use gemm_tuning::{load_gemm_tuning, save_gemm_tuning};
pub use grouped::{
    per_group_pays, BatchedOperands, GroupEpilogue, GroupLayout, GroupedFp8Scaling,
    GroupedGemmPath, GroupedOperand, Groups, InputRows, RowGroup, RowMove,
};
pub use host_sync::{host_syncs, HostSyncs};
pub use norm::{NormBackward, NormForward, NormSpec};
pub use ops::{
    ActivationOps, AttentionOps, BytesOps, GemmOps, GroupedOps, LowpTypes, NormOps, OptimOps,
    QuantizeOps, RoutingOps, StatsOps,
};
pub use optim::{AdamWStep, AdamWTensors};
// For the CubeCL casts (`cube/`), compiled with the wgpu or cuda feature only.
#[cfg(any(feature = "wgpu", feature = "cuda"))]
pub(crate) use quantized::last_column;
pub use quantized::{
    AmaxHistoryColumns, QuantizedParts, QuantizedStorage, QuantizedTensor, QuantizedTensorParts,
    ScaleColumns, ScaleParts, Storage, StorageScales,
};
pub use routing::TokenRoutes;

/// The operations burn-lowp adds to a Burn backend: one ops trait per concern (`ops`), each
/// implemented by the backend (`ndarray`, `cube`), most with a Burn-op default beside it. A
/// marker: every backend implements it with an empty impl once it implements every ops trait.
pub trait LowpBackend:
    LowpTypes
    + BytesOps<Self>
    + QuantizeOps<Self>
    + GemmOps<Self>
    + GroupedOps<Self>
    + RoutingOps<Self>
    + NormOps<Self>
    + ActivationOps<Self>
    + AttentionOps<Self>
    + OptimOps<Self>
    + StatsOps<Self>
{
}

/// The `FloatDType` of a float tensor's dtype (f32 for anything but f16 and bf16).
pub(crate) fn float_dtype(dtype: burn::tensor::DType) -> burn::tensor::FloatDType {
    use burn::tensor::{DType, FloatDType};
    match dtype {
        DType::BF16 => FloatDType::BF16,
        DType::F16 => FloatDType::F16,
        _ => FloatDType::F32,
    }
}

/// The 2D view `[prod(shape[..-1]), shape[-1]]` of a tensor shape.
pub(crate) fn matrix_dims(shape: &[usize]) -> (usize, usize) {
    let cols = shape.last().copied().unwrap_or(1);
    let rows = shape[..shape.len().saturating_sub(1)].iter().product();
    (rows, cols)
}
