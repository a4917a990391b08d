//! `LowpBackend`: the operations burn-lowp adds to a Burn backend. Implemented for
//! `CubeBackend<R, ..>` (the CubeCL kernels, on CUDA or wgpu) and for `NdArray` (the reference
//! quantizers), so modules written against `B: LowpBackend` run on both.

use burn::tensor::backend::Backend;
use burn::tensor::ops::FloatTensor;

use crate::error::Result;
use crate::format::{Direction, FormatConfig, Fp8Format, HostMatrix, Usage};
use crate::quant::QuantizedTensor;

#[cfg(any(feature = "wgpu", feature = "cuda"))]
pub mod cube;
#[cfg(feature = "cuda")]
pub mod cublaslt;
#[cfg(feature = "cuda")]
pub mod cuda_gemm;
pub mod device;
pub mod gemm;

pub use gemm::{GemmKind, GemmOptions, GemmPath};
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
