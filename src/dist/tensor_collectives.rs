//! `TensorAllReduce` for Burn tensors on CubeCL's CUDA runtime: NCCL on the tensor's own buffer,
//! ordered against CubeCL's stream (`Collectives`), no host wait.

use burn::tensor::{DType, Tensor, TensorPrimitive};
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::{BoolElement, CubeBackend, FloatElement, IntElement};
use burn_lowp_kernels::cubecl::cuda::CudaRuntime;

use super::collectives::Collectives;
use super::grad_reduce::{ReduceOp, TensorAllReduce};
use super::nccl::ReduceDtype;
use crate::error::{LowpError, Result};

impl<F: FloatElement, I: IntElement, BT: BoolElement> TensorAllReduce<CubeBackend<CudaRuntime, F, I, BT>> for Collectives {
    fn all_reduce(&self, tensor: Tensor<CubeBackend<CudaRuntime, F, I, BT>, 1>, op: ReduceOp) -> Result<Tensor<CubeBackend<CudaRuntime, F, I, BT>, 1>> {
        let input: CubeTensor<CudaRuntime> = into_contiguous(tensor.into_primitive().tensor());
        let dtype = match input.dtype {
            DType::F32 => ReduceDtype::F32,
            DType::BF16 => ReduceDtype::Bf16,
            other => return Err(LowpError::invalid("all-reduce dtype", format!("{other:?}"), "must be F32 or BF16")),
        };
        let count = input.meta.shape().num_elements();
        // A fresh output: the input's buffer may be shared (a view, a kept copy).
        let output = input.client.empty(count * dtype.size());
        Collectives::all_reduce(self, &input.handle, &output, count, dtype, op)?;
        let out = CubeTensor::new_contiguous(input.client.clone(), input.device.clone(), input.meta.shape().clone(), output, input.dtype);
        Ok(Tensor::from_primitive(TensorPrimitive::Float(out)))
    }
}
