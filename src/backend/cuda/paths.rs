//! Which CUDA paths this build and device take, where a CubeCL build without the repository's
//! vendored crates (a crate depending on burn-lowp gets the published ones) falls back: the GEMM
//! stream ordering (events on CubeCL's stream, or the device-flags handshake) and the FP8 cast
//! (the saturating hardware conversion, or the integer encoder). One line for programs to print.

use burn_lowp_kernels::cubecl::cuda::{CudaDevice, CudaRuntime};
use burn_lowp_kernels::cubecl::prelude::*;
use burn_lowp_kernels::cast::codec::Fp8Encoder;

use super::cublaslt::{stream_ordering, StreamOrdering};

/// `stream ordering: events|device flags|host sync; FP8 cast: hardware|integer encoder` for CUDA
/// device `device` (the FP8 choice probes the device once: `fp8_encoder`).
pub fn active_paths(device: usize) -> String {
    let ordering = match stream_ordering() {
        StreamOrdering::CubeclStream => "events",
        StreamOrdering::DeviceFlags => "device flags",
        StreamOrdering::HostSync => "host sync",
    };
    let client = CudaRuntime::client(&CudaDevice::new(device));
    let cast = match burn_lowp_kernels::fp8_encoder(&client) {
        Fp8Encoder::Instruction => "hardware",
        Fp8Encoder::Integer => "integer encoder",
    };
    format!("burn-lowp CUDA paths: stream ordering: {ordering}; FP8 cast: {cast}")
}
