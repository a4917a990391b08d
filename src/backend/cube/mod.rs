//! `LowpBackend` for `CubeBackend<R, ..>`: the CubeCL kernels of `burn-lowp-kernels`, on CUDA or
//! wgpu. Inputs are read as raw words of their own dtype (f32, f16 or bf16). One file per ops
//! trait (`bytes.rs`, `quantize.rs`, `gemm.rs`, `grouped.rs`, `routing.rs`, `norm.rs`,
//! `activation.rs`, `attention.rs`, `optim.rs`, `stats.rs`), and what they share: the kernels'
//! buffers (`buffers.rs`), the quantize plumbing (`cast.rs`), reads to the host that do not block
//! (`host_read.rs`) and the grouped layout kernel (`group_layout.rs`).

use burn_cubecl::{BoolElement, CubeBackend, CubeRuntime, FloatElement, IntElement};

use crate::backend::{LowpBackend, LowpTypes};

mod activation;
mod attention;
mod buffers;
mod bytes;
mod cast;
mod gemm;
mod group_layout;
mod grouped;
mod host_read;
mod norm;
mod optim;
mod quantize;
mod routing;
mod stats;

pub use buffers::CubeBytes;
#[cfg(feature = "cuda")]
pub(crate) use buffers::elem_kind;
#[cfg(feature = "cuda")]
pub(crate) use host_read::DeviceTasks;

impl<R: CubeRuntime, F: FloatElement, I: IntElement, BT: BoolElement> LowpTypes
    for CubeBackend<R, F, I, BT>
{
    type Bytes = CubeBytes<R>;
}

impl<R: CubeRuntime, F: FloatElement, I: IntElement, BT: BoolElement> LowpBackend
    for CubeBackend<R, F, I, BT>
{
}
