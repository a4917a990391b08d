//! Collectives on Burn tensors of CubeCL's CUDA runtime: NCCL on the tensor's own buffer, ordered
//! against CubeCL's stream (`Collectives`), no host wait (the counts' all-gather aside, which the
//! caller reads on the host).
//! * `TensorAllReduce`: data parallelism's gradient buckets, amaxes, metrics;
//! * `TokenAllToAll`: expert parallelism's token exchange over the EP group's communicator.

use burn::tensor::{DType, Int, Shape, Tensor, TensorPrimitive};
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::{BoolElement, CubeBackend, FloatElement, IntElement};
use burn_lowp_kernels::cubecl::cuda::CudaRuntime;
use burn_lowp_kernels::cubecl::server::Handle;

use super::collectives::Collectives;
use super::grad_reduce::{ReduceOp, TensorAllReduce};
use super::nccl::ReduceDtype;
use super::split::AllToAllSplits;
use super::token_exchange::{check_splits, host_counts, TokenAllToAll};
use crate::error::{LowpError, Result};

type Cuda<F, I, BT> = CubeBackend<CudaRuntime, F, I, BT>;

impl<F: FloatElement, I: IntElement, BT: BoolElement> TensorAllReduce<Cuda<F, I, BT>> for Collectives {
    fn all_reduce(&self, tensor: Tensor<Cuda<F, I, BT>, 1>, op: ReduceOp) -> Result<Tensor<Cuda<F, I, BT>, 1>> {
        all_reduce_tensor(tensor, |send, recv, count, dtype| Collectives::all_reduce(self, send, recv, count, dtype, op))
    }

    fn all_reduce_unjoined(&self, tensor: Tensor<Cuda<F, I, BT>, 1>, op: ReduceOp) -> Result<Tensor<Cuda<F, I, BT>, 1>> {
        all_reduce_tensor(tensor, |send, recv, count, dtype| Collectives::all_reduce_unjoined(self, send, recv, count, dtype, op))
    }

    fn join(&self) -> Result<()> {
        Collectives::join(self)
    }
}

/// `reduce(send, recv, count, dtype)` from `tensor`'s buffer into a fresh one, as a tensor.
fn all_reduce_tensor<F: FloatElement, I: IntElement, BT: BoolElement>(
    tensor: Tensor<Cuda<F, I, BT>, 1>,
    reduce: impl FnOnce(&Handle, &Handle, usize, ReduceDtype) -> Result<()>,
) -> Result<Tensor<Cuda<F, I, BT>, 1>> {
    let input: CubeTensor<CudaRuntime> = into_contiguous(tensor.into_primitive().tensor());
    let dtype = match input.dtype {
        DType::F32 => ReduceDtype::F32,
        DType::BF16 => ReduceDtype::Bf16,
        other => return Err(LowpError::invalid("all-reduce dtype", format!("{other:?}"), "must be F32 or BF16")),
    };
    let count = input.meta.shape().num_elements();
    // In place where the input's buffer is ours alone (a bucket, a cast copy: NCCL takes the
    // same buffer as input and output), which halves what an unjoined reduction holds until
    // its join; else a fresh output (a view, a buffer still used elsewhere).
    let output = match input.can_mut() {
        true => input.handle.clone(),
        false => input.client.empty(count * dtype.size()),
    };
    reduce(&input.handle, &output, count, dtype)?;
    let out = CubeTensor::new_contiguous(input.client.clone(), input.device.clone(), input.meta.shape().clone(), output, input.dtype);
    Ok(Tensor::from_primitive(TensorPrimitive::Float(out)))
}

/// A buffer of at least `bytes` bytes (one element's worth when empty: an exchange may leave a
/// rank no rows).
fn buffer_bytes(bytes: usize, elem: usize) -> usize {
    bytes.max(elem)
}

impl<F: FloatElement, I: IntElement, BT: BoolElement> TokenAllToAll<Cuda<F, I, BT>> for Collectives {
    fn ep_rank(&self) -> usize {
        self.rank()
    }

    fn ep_size(&self) -> usize {
        self.size()
    }

    fn gather_counts(&self, counts: Tensor<Cuda<F, I, BT>, 1, Int>) -> Result<Vec<usize>> {
        let input: CubeTensor<CudaRuntime> = into_contiguous(counts.into_primitive());
        let n = input.meta.shape().num_elements();
        let elem = input.dtype.size();
        let output = input.client.empty(buffer_bytes(n * elem * self.size(), elem));
        self.all_gather(&input.handle, &output, n * elem)?;
        let gathered = CubeTensor::new_contiguous(input.client.clone(), input.device.clone(), Shape::new([n * self.size()]), output, input.dtype);
        // The host read of the exchange (`token_exchange`): the split sizes NCCL takes.
        host_counts(Tensor::<Cuda<F, I, BT>, 1, Int>::from_primitive(gathered))
    }

    fn all_to_all(&self, rows: Tensor<Cuda<F, I, BT>, 2>, send: &[usize], recv: &[usize]) -> Result<Tensor<Cuda<F, I, BT>, 2>> {
        let [n, hidden] = rows.dims();
        check_splits(n, send, recv, self.size())?;
        let input: CubeTensor<CudaRuntime> = into_contiguous(rows.into_primitive().tensor());
        let elem = input.dtype.size();
        let row_bytes = hidden * elem;
        let received: usize = recv.iter().sum();
        let output = input.client.empty(buffer_bytes(received * row_bytes, elem));
        Collectives::all_to_all(self, &input.handle, AllToAllSplits::bytes(send, row_bytes)?, &output, AllToAllSplits::bytes(recv, row_bytes)?)?;
        let out = CubeTensor::new_contiguous(input.client.clone(), input.device.clone(), Shape::new([received, hidden]), output, input.dtype);
        Ok(Tensor::from_primitive(TensorPrimitive::Float(out)))
    }
}
