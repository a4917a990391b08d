//! `BytesOps`: device byte buffers to and from the host, views of them, and float tensors made
//! from host matrices or from bytes holding f32 values. Every other op's results that are not
//! Burn tensors (codes, scales, amaxes, statistics records) are read through these.

use std::ops::Range;

use burn::tensor::ops::FloatTensor;

use crate::backend::LowpBackend;
use crate::error::Result;
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
}
