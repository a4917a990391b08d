//! `BytesOps` on `CubeBackend`: device byte buffers are CubeCL handles (`CubeBytes`); reads to
//! the host go through the device thread without blocking (`host_read`), and a byte range is a
//! view on CUDA (which binds any offset) and a copy elsewhere.

use burn::tensor::ops::FloatTensor;
use burn::tensor::{DType, Shape};
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::{BoolElement, CubeBackend, CubeRuntime, FloatElement, IntElement};
use burn_lowp_kernels as kernels;

use super::CubeBytes;
use super::buffers::{bytes, float_tensor};
use super::host_read::host_read_later;
use crate::backend::BytesOps;
use crate::error::Result;
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
}
