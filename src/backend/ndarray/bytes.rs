//! `BytesOps` on `NdArray`: device bytes are host bytes shared between clones (`HostBytes`), so
//! reads are clones and a byte range is a copy.

use burn::backend::ndarray::{NdArray, NdArrayDevice, NdArrayTensor};
use burn::tensor::ops::FloatTensor;
use burn::tensor::TensorData;

use super::upload;
use super::HostBytes;
use crate::backend::BytesOps;
use crate::format::HostMatrix;

impl BytesOps<Self> for NdArray {
    fn bytes_to_host(bytes: &HostBytes) -> Vec<u8> {
        bytes.as_ref().clone()
    }

    fn bytes_from_host(bytes: Vec<u8>, _device: &NdArrayDevice) -> HostBytes {
        upload(bytes)
    }

    fn bytes_device(_bytes: &HostBytes) -> NdArrayDevice {
        Default::default()
    }

    fn bytes_slice(bytes: &HostBytes, range: std::ops::Range<usize>) -> HostBytes {
        upload(bytes[range].to_vec())
    }

    fn bytes_as_float(bytes: &HostBytes, shape: [usize; 2]) -> FloatTensor<Self> {
        let values: Vec<f32> = bytes
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        NdArrayTensor::from_data(TensorData::new(values, shape))
    }

    fn bytes_float_from_host(m: &HostMatrix, _device: &NdArrayDevice) -> FloatTensor<Self> {
        NdArrayTensor::from_data(TensorData::new(m.values.clone(), [m.rows, m.cols]))
    }

    fn bytes_len(bytes: &HostBytes) -> usize {
        bytes.len()
    }
}
