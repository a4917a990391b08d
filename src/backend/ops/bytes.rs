//! `BytesOps`: device byte buffers to and from the host, views of them, and float tensors made
//! from host matrices or from bytes holding f32 values. Every other op's results that are not
//! Burn tensors (codes, scales, amaxes, statistics records) are read through these.

use std::ops::Range;

use burn::tensor::ops::{FloatTensor, IntTensor};
use burn::tensor::{DType, Int, Tensor, TensorData, TensorPrimitive};

use crate::backend::LowpBackend;
use crate::error::{LowpError, Result};
use crate::format::HostMatrix;

pub trait BytesOps<B: LowpBackend> {
    /// Reads a device buffer back (synchronizes).
    fn bytes_to_host(bytes: &B::Bytes) -> Vec<u8>;

    /// Starts copying device buffers to the host and returns what waits for them: on CUDA the
    /// copies are queued now (into pinned memory) and the closure blocks only if they have not
    /// arrived when it is called. Elsewhere the buffers are read at once.
    fn bytes_to_host_later(
        bytes: Vec<B::Bytes>,
    ) -> Box<dyn FnOnce() -> Result<Vec<Vec<u8>>> + Send> {
        let read: Vec<Vec<u8>> = bytes.iter().map(B::bytes_to_host).collect();
        Box::new(move || Ok(read))
    }

    /// Uploads bytes to a device buffer.
    fn bytes_from_host(bytes: Vec<u8>, device: &B::Device) -> B::Bytes;

    /// The device a buffer lives on.
    fn bytes_device(bytes: &B::Bytes) -> B::Device;

    /// Bytes `range` of a buffer: a view where the backend can make one, else a copy.
    fn bytes_slice(bytes: &B::Bytes, range: Range<usize>) -> B::Bytes;

    /// Uploads a host matrix as a `[rows, cols]` float tensor of the matrix's own dtype where the
    /// backend can hold it (NdArray holds f32 only).
    fn bytes_float_from_host(m: &HostMatrix, device: &B::Device) -> FloatTensor<B>;

    /// Device bytes holding f32 values, as a float tensor of `shape` (no copy where the backend
    /// can share the buffer; used to hand a recorded amax to tensor code without a host sync).
    fn bytes_as_float(bytes: &B::Bytes, shape: [usize; 2]) -> FloatTensor<B>;

    /// The length of a buffer in bytes.
    fn bytes_len(bytes: &B::Bytes) -> usize;

    /// A buffer as a `[rows, cols]` Int tensor of dtype `U8` (`rows * cols` must be its length):
    /// the buffer itself where the backend can share it (CubeCL), else a copy through the host.
    fn bytes_as_u8(bytes: &B::Bytes, shape: [usize; 2]) -> IntTensor<B> {
        let data = TensorData::from_bytes_vec(B::bytes_to_host(bytes), shape, DType::U8);
        Tensor::<B, 2, Int>::from_data(data, (&B::bytes_device(bytes), DType::U8)).into_primitive()
    }

    /// An Int tensor's values as bytes, one a value (`tensor` names it in errors): its buffer
    /// where the backend can share it (a contiguous `U8` CubeCL tensor), else read through the
    /// host, where values of other integer dtypes must lie in `0..=255`.
    fn u8_into_bytes(values: IntTensor<B>, tensor: &str) -> Result<B::Bytes> {
        let t = Tensor::<B, 1, Int>::from_primitive(values);
        let device = t.device();
        let bytes = int_data_bytes(t.into_data(), tensor)?;
        Ok(B::bytes_from_host(bytes, &device))
    }

    /// A float tensor's values as f32 bytes (`tensor` names it in errors): its buffer where the
    /// backend can share it (a contiguous `F32` CubeCL tensor), else read through the host; any
    /// other dtype is an error (a cast would change the bytes).
    fn f32_into_bytes(values: FloatTensor<B>, tensor: &str) -> Result<B::Bytes> {
        let t = Tensor::<B, 1>::from_primitive(TensorPrimitive::Float(values));
        let device = t.device();
        let bytes = f32_data_bytes(t.into_data(), tensor)?;
        Ok(B::bytes_from_host(bytes, &device))
    }
}

/// The bytes of Int `TensorData` holding byte values (of any integer dtype, each in `0..=255`).
pub(crate) fn int_data_bytes(data: TensorData, tensor: &str) -> Result<Vec<u8>> {
    if data.dtype == DType::U8 {
        return Ok(data.bytes.to_vec());
    }
    if !(data.dtype.is_int() || data.dtype.is_uint()) {
        return Err(LowpError::Dtype {
            tensor: tensor.to_string(),
            dtype: format!("{:?}", data.dtype),
            supported: "byte values in an Int tensor (U8, or another integer dtype)".to_string(),
        });
    }
    let values = data.convert::<i64>().into_vec::<i64>().map_err(|e| {
        LowpError::invalid(tensor, format!("{e:?}"), "an Int tensor readable as i64")
    })?;
    values
        .iter()
        .map(|&v| {
            u8::try_from(v).map_err(|_| {
                LowpError::invalid(tensor, v, "byte values must lie in 0..=255")
            })
        })
        .collect()
}

/// The bytes of f32 `TensorData`; other dtypes are an error.
pub(crate) fn f32_data_bytes(data: TensorData, tensor: &str) -> Result<Vec<u8>> {
    if data.dtype != DType::F32 {
        return Err(LowpError::Dtype {
            tensor: tensor.to_string(),
            dtype: format!("{:?}", data.dtype),
            supported: "F32 (scales and amaxes are f32 bytes)".to_string(),
        });
    }
    Ok(data.bytes.to_vec())
}
