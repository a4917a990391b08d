//! `GemmOps` on `CubeBackend`: cuBLASLt on CUDA (`backend::cuda`), the dequantize-and-matmul
//! reference elsewhere (wgpu has no FP8 GEMM).

use burn::tensor::ops::FloatTensor;
use burn_cubecl::{BoolElement, CubeBackend, CubeRuntime, FloatElement, IntElement};

use crate::backend::ops::gemm::{batched_matmul_reference, dequantize_matmul};
use crate::backend::{GemmCall, GemmKind, GemmOps, GemmOptions, GemmPath, QuantizedTensor, Transposes};
use crate::error::Result;

impl<R: CubeRuntime, F: FloatElement, I: IntElement, BT: BoolElement> GemmOps<Self>
    for CubeBackend<R, F, I, BT>
{
    fn gemm_quantized(
        kind: GemmKind,
        a: &QuantizedTensor<Self>,
        b: &QuantizedTensor<Self>,
        options: GemmOptions<Self>,
    ) -> Result<FloatTensor<Self>> {
        #[cfg(feature = "cuda")]
        if crate::backend::cuda::is_cuda::<R>() {
            return crate::backend::cuda::gemm::gemm(kind, a, b, options);
        }
        dequantize_matmul(kind, a, b, burn::tensor::FloatDType::F32, options)
    }

    fn gemm_batched(
        a: FloatTensor<Self>,
        b: FloatTensor<Self>,
        t: Transposes,
    ) -> Result<FloatTensor<Self>> {
        #[cfg(feature = "cuda")]
        if crate::backend::cuda::is_cuda::<R>() {
            return crate::backend::cuda::batched::batched_matmul::<R, F, I, BT>(a, b, t);
        }
        batched_matmul_reference::<Self>(a, b, t)
    }

    fn gemm_group(calls: Vec<GemmCall<'_, Self>>) -> Result<Vec<FloatTensor<Self>>> {
        #[cfg(feature = "cuda")]
        if crate::backend::cuda::is_cuda::<R>() {
            return crate::backend::cuda::gemm::gemm_group(calls);
        }
        calls
            .into_iter()
            .map(|c| Self::gemm_quantized(c.kind, c.a, c.b, c.options))
            .collect()
    }

    fn gemm_path(
        kind: GemmKind,
        a: &QuantizedTensor<Self>,
        b: &QuantizedTensor<Self>,
    ) -> GemmPath {
        #[cfg(feature = "cuda")]
        if crate::backend::cuda::is_cuda::<R>() {
            return crate::backend::cuda::gemm::gemm_path(kind, a, b);
        }
        let _ = (kind, a, b);
        GemmPath::DequantizeMatmul
    }
}
