//! `LowpBackend`: the operations burn-lowp adds to a Burn backend. Implemented for
//! `CubeBackend<R, ..>` (the CubeCL kernels, on CUDA or wgpu) and for `NdArray` (the reference
//! quantizers), so modules written against `B: LowpBackend` run on both.

use std::ops::Range;

use burn::tensor::backend::Backend;
use burn::tensor::ops::{FloatTensor, IntTensor};

use crate::error::Result;
use crate::format::{Direction, FormatConfig, Fp8Format, HostMatrix, Usage};
use crate::quant::QuantizedTensor;

#[cfg(any(feature = "wgpu", feature = "cuda"))]
pub mod cube;
#[cfg(feature = "cuda")]
pub mod cublaslt;
#[cfg(feature = "cuda")]
pub mod cuda_gemm;
#[cfg(feature = "cuda")]
pub mod cuda_grouped;
pub mod device;
pub mod gemm;
pub mod grouped;
pub mod host_sync;

pub use gemm::{GemmKind, GemmOptions, GemmPath};
pub use grouped::{GroupLayout, GroupedGemmPath, GroupedOperand, Groups, RowGroup};
pub use host_sync::{host_syncs, HostSyncs};
#[cfg(feature = "ndarray")]
pub mod ndarray;

pub trait LowpBackend: Backend {
    /// A device buffer of raw bytes (codes, scales, amaxes).
    type Bytes: Clone + std::fmt::Debug + Send + Sync + 'static;

    /// Quantizes `x` (any rank, viewed as `[prod(leading dims), last dim]`), producing the
    /// representations in `usage`. With `optimize_for_gemm`, MXFP8/NVFP4 scales are written
    /// GEMM-swizzled.
    fn lowp_quantize(
        x: FloatTensor<Self>,
        config: &FormatConfig,
        usage: Usage,
        optimize_for_gemm: bool,
    ) -> Result<QuantizedTensor<Self>>;

    /// FP8 per-tensor quantization with a given scale (delayed scaling): `scale` is a one-element
    /// f32 tensor on the device; the result records this tensor's amax.
    fn quantize_fp8_with_scale(
        x: FloatTensor<Self>,
        fp8: Fp8Format,
        scale: FloatTensor<Self>,
        usage: Usage,
    ) -> Result<QuantizedTensor<Self>>;

    /// Dequantizes one representation to an f32 `[rows, cols]` tensor. Block scales must be compact.
    fn lowp_dequantize(
        q: &QuantizedTensor<Self>,
        direction: Direction,
    ) -> Result<FloatTensor<Self>>;

    /// Rewrites MXFP8/NVFP4 block scales into the GEMM-swizzled layout.
    fn swizzle_scales(q: QuantizedTensor<Self>) -> Result<QuantizedTensor<Self>>;

    /// Rewrites swizzled block scales back into the compact layout.
    fn unswizzle_scales(q: QuantizedTensor<Self>) -> Result<QuantizedTensor<Self>>;

    /// Reads a device buffer back (synchronizes).
    fn bytes_to_host(bytes: &Self::Bytes) -> Vec<u8>;

    /// Starts copying device buffers to the host and returns what waits for them: on CUDA the
    /// copies are queued now (into pinned memory) and the closure blocks only if they have not
    /// arrived when it is called. Elsewhere the buffers are read at once.
    fn bytes_to_host_later(
        bytes: Vec<Self::Bytes>,
    ) -> Box<dyn FnOnce() -> Result<Vec<Vec<u8>>> + Send> {
        let read: Vec<Vec<u8>> = bytes.iter().map(Self::bytes_to_host).collect();
        Box::new(move || Ok(read))
    }

    /// Uploads bytes to a device buffer.
    fn bytes_from_host(bytes: Vec<u8>, device: &Self::Device) -> Self::Bytes;

    /// The device a buffer lives on.
    fn bytes_device(bytes: &Self::Bytes) -> Self::Device;

    /// Bytes `range` of a buffer: a view where the backend can make one, else a copy.
    fn bytes_slice(bytes: &Self::Bytes, range: Range<usize>) -> Self::Bytes;

    /// The aligned layout (`grouped::GroupLayout`) of `tokens` packed tokens split into groups by
    /// `m_splits` (one Int per group, on the device), made without reading the splits on the
    /// host; their host copy is requested at once. Errors only on what the host knows (the
    /// shape); the splits' own check is read with their host copy (`GroupLayout::check`).
    fn group_layout(m_splits: IntTensor<Self>, tokens: usize) -> Result<GroupLayout<Self>>;

    /// Quantizes a grouped `[rows, cols]` matrix (`format::grouped`): each group as its slice
    /// alone would be, laid out group after group. Compact scales.
    fn lowp_quantize_grouped(
        x: FloatTensor<Self>,
        groups: &Groups<Self>,
        config: &FormatConfig,
        usage: Usage,
    ) -> Result<QuantizedTensor<Self>>;

    /// FP8 per-tensor quantization of a grouped matrix with each group's given scale (delayed
    /// scaling): `scales` is an f32 tensor of one value per group; the result records each
    /// group's amax.
    fn quantize_fp8_with_scale_grouped(
        x: FloatTensor<Self>,
        fp8: Fp8Format,
        scales: FloatTensor<Self>,
        groups: &Groups<Self>,
        usage: Usage,
    ) -> Result<QuantizedTensor<Self>>;

    /// One GEMM per group (`GemmKind` per group, see `grouped::grouped_output_shape`). The
    /// default runs each group's GEMM on the host-known groups (`grouped_gemm_per_group`); CUDA
    /// runs fprop and dgrad of BF16 and FP8 per-tensor operands as one graph-safe cuBLASLt call.
    fn lowp_grouped_gemm(
        kind: GemmKind,
        a: GroupedOperand<Self>,
        b: GroupedOperand<Self>,
        options: GemmOptions<Self>,
    ) -> Result<FloatTensor<Self>> {
        grouped::grouped_gemm_per_group(kind, a, b, options)
    }

    /// The path `lowp_grouped_gemm` takes for these operands.
    fn grouped_gemm_path(
        _kind: GemmKind,
        _a: GroupedOperand<Self>,
        _b: GroupedOperand<Self>,
    ) -> GroupedGemmPath {
        GroupedGemmPath::PerGroup(GemmPath::DequantizeMatmul)
    }

    /// `Σ` over each group's token rows of an aligned `[rows, cols]` tensor: `[groups, cols]`
    /// (the grouped bias gradient). The default reads the groups on the host.
    fn grouped_column_sum(t: FloatTensor<Self>, layout: &GroupLayout<Self>) -> Result<FloatTensor<Self>> {
        grouped::grouped_column_sum_per_group(t, &layout.groups)
    }

    /// Uploads a host matrix as a `[rows, cols]` float tensor of the matrix's own dtype where the
    /// backend can hold it (NdArray holds f32 only).
    fn float_from_host(m: &HostMatrix, device: &Self::Device) -> FloatTensor<Self>;

    /// Device bytes holding f32 values, as a float tensor of `shape` (no copy where the backend
    /// can share the buffer; used to hand a recorded amax to tensor code without a host sync).
    fn float_from_bytes(bytes: &Self::Bytes, shape: [usize; 2]) -> FloatTensor<Self>;

    /// One of a linear layer's GEMMs on quantized operands, each read from the representation
    /// its kind needs (see `GemmKind`). The default dequantizes to f32 and uses the backend's
    /// matmul; CUDA overrides it with cuBLASLt.
    fn lowp_gemm(
        kind: GemmKind,
        a: &QuantizedTensor<Self>,
        b: &QuantizedTensor<Self>,
        options: GemmOptions<Self>,
    ) -> Result<FloatTensor<Self>> {
        gemm::dequantize_matmul(kind, a, b, burn::tensor::FloatDType::F32, options)
    }

    /// The path `lowp_gemm` takes for these operands.
    fn gemm_path(
        _kind: GemmKind,
        _a: &QuantizedTensor<Self>,
        _b: &QuantizedTensor<Self>,
    ) -> GemmPath {
        GemmPath::DequantizeMatmul
    }
}

/// The 2D view `[prod(shape[..-1]), shape[-1]]` of a tensor shape.
pub(crate) fn matrix_dims(shape: &[usize]) -> (usize, usize) {
    let cols = shape.last().copied().unwrap_or(1);
    let rows = shape[..shape.len().saturating_sub(1)].iter().product();
    (rows, cols)
}
