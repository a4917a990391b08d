//! `BytesOps` on `CubeBackend`: device byte buffers are CubeCL handles (`CubeBytes`); reads to
//! the host go through the device thread without blocking (`host_read`), and a byte range is a
//! view on CUDA (which binds any offset) and a copy elsewhere.

use burn::tensor::ops::{FloatTensor, IntTensor};
use burn::tensor::{DType, Int, Shape, Tensor, TensorMetadata, TensorPrimitive};
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::{BoolElement, CubeBackend, CubeRuntime, FloatElement, IntElement};
use burn_lowp_kernels as kernels;

use super::CubeBytes;
use super::buffers::{bytes, float_tensor};
use super::host_read::host_read_later;
use crate::backend::ops::bytes::{f32_data_bytes, int_data_bytes};
use crate::backend::BytesOps;
use crate::error::{LowpError, Result};
use crate::format::{HostMatrix, InputDtype};

impl<R: CubeRuntime, F: FloatElement, I: IntElement, BT: BoolElement> BytesOps<Self>
    for CubeBackend<R, F, I, BT>
{
    fn bytes_to_host(bytes: &CubeBytes<R>) -> Vec<u8> {
        let data = bytes
            .client
            .read_one(bytes.handle.clone())
            .expect("device read failed");
        data[..bytes.len].to_vec()
    }

    fn bytes_to_host_later(
        bytes: Vec<CubeBytes<R>>,
    ) -> Box<dyn FnOnce() -> Result<Vec<Vec<u8>>> + Send> {
        host_read_later(bytes, false).0
    }

    fn bytes_from_host(data: Vec<u8>, device: &R::Device) -> CubeBytes<R> {
        let client = R::client(device);
        let len = data.len();
        // `create` with heap bytes queues the upload (no staging round trip to the device thread,
        // which `create_from_slice` waits for).
        let handle = client.create(burn_lowp_kernels::cubecl::bytes::Bytes::from_bytes_vec(data));
        bytes(&client, device, handle, len)
    }

    fn bytes_device(bytes: &CubeBytes<R>) -> R::Device {
        bytes.device.clone()
    }

    fn bytes_slice(b: &CubeBytes<R>, range: std::ops::Range<usize>) -> CubeBytes<R> {
        assert!(range.end <= b.len, "byte range {range:?} of a {}-byte buffer", b.len);
        #[cfg(feature = "cuda")]
        if crate::backend::cuda::is_cuda::<R>() {
            // A view: CUDA binds any offset.
            let trim_end = (b.len - range.end) as u64;
            let handle = b.handle.clone().offset_start(range.start as u64).offset_end(trim_end);
            return bytes(&b.client, &b.device, handle, range.len());
        }
        // Other runtimes may bind only aligned offsets: copy (every grouped range is whole words).
        let handle = kernels::copy_range(&b.client, &b.handle, range.start, range.len());
        bytes(&b.client, &b.device, handle, range.len())
    }

    fn bytes_as_float(bytes: &CubeBytes<R>, shape: [usize; 2]) -> FloatTensor<Self> {
        float_tensor(
            &bytes.client,
            &bytes.device,
            bytes.handle.clone(),
            shape[0],
            shape[1],
        )
    }

    fn bytes_float_from_host(m: &HostMatrix, device: &R::Device) -> FloatTensor<Self> {
        let client = R::client(device);
        let (bytes, dtype): (Vec<u8>, DType) = match m.dtype {
            InputDtype::F32 => (
                m.values.iter().flat_map(|v| v.to_le_bytes()).collect(),
                DType::F32,
            ),
            InputDtype::F16 => (
                m.values
                    .iter()
                    .flat_map(|&v| half::f16::from_f32(v).to_le_bytes())
                    .collect(),
                DType::F16,
            ),
            InputDtype::BF16 => (
                m.values
                    .iter()
                    .flat_map(|&v| half::bf16::from_f32(v).to_le_bytes())
                    .collect(),
                DType::BF16,
            ),
        };
        let handle = client.create_from_slice(&bytes);
        CubeTensor::new_contiguous(
            client,
            device.clone(),
            Shape::new([m.rows, m.cols]),
            handle,
            dtype,
        )
    }

    fn bytes_len(bytes: &CubeBytes<R>) -> usize {
        bytes.len
    }

    fn bytes_as_u8(bytes: &CubeBytes<R>, shape: [usize; 2]) -> IntTensor<Self> {
        assert_eq!(shape[0] * shape[1], bytes.len, "a U8 tensor of shape {shape:?} over {} bytes", bytes.len);
        // The same buffer: no copy, no host round trip.
        CubeTensor::new_contiguous(
            bytes.client.clone(),
            bytes.device.clone(),
            Shape::new(shape),
            bytes.handle.clone(),
            DType::U8,
        )
    }

    fn u8_into_bytes(values: IntTensor<Self>, tensor: &str) -> Result<CubeBytes<R>> {
        let values = if values.dtype == DType::U8 {
            let values = into_contiguous(values);
            if aligned(&values) {
                return Ok(shared_bytes(values));
            }
            values
        } else {
            values
        };
        let device = values.device.clone();
        let data = Tensor::<Self, 1, Int>::from_primitive(values).into_data();
        Ok(Self::bytes_from_host(int_data_bytes(data, tensor)?, &device))
    }

    fn f32_into_bytes(values: FloatTensor<Self>, tensor: &str) -> Result<CubeBytes<R>> {
        if values.dtype != DType::F32 {
            return Err(LowpError::Dtype {
                tensor: tensor.to_string(),
                dtype: format!("{:?}", values.dtype),
                supported: "F32 (scales and amaxes are f32 bytes)".to_string(),
            });
        }
        let values = into_contiguous(values);
        if aligned(&values) {
            return Ok(shared_bytes(values));
        }
        let device = values.device.clone();
        let data = Tensor::<Self, 1>::from_primitive(TensorPrimitive::Float(values)).into_data();
        Ok(Self::bytes_from_host(f32_data_bytes(data, tensor)?, &device))
    }
}

/// Whether a contiguous tensor's data starts 16-byte aligned (what the kernels load), so that
/// its buffer can serve as device bytes as is; a view at another offset is copied instead.
fn aligned<R: CubeRuntime>(t: &CubeTensor<R>) -> bool {
    t.handle.offset_start.unwrap_or(0).is_multiple_of(16)
}

/// A contiguous, aligned tensor's buffer as device bytes (shared: no copy).
fn shared_bytes<R: CubeRuntime>(t: CubeTensor<R>) -> CubeBytes<R> {
    let len = t.shape().num_elements() * t.dtype.size();
    bytes(&t.client, &t.device, t.handle, len)
}
