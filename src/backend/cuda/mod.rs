//! CUDA-only code of `CubeBackend`: GEMMs through cuBLASLt on the buffers CubeCL owns
//! (`cublaslt/`: plans, algorithm choice, stream ordering against CubeCL's stream, marks, our
//! streams' kernels), the operands laid out for it (`gemm.rs`: one GEMM or a group of them;
//! `batched.rs`: strided batches; `grouped.rs`: grouped MoE GEMMs), our Hopper grouped GEMM
//! (`sm90_grouped.rs` with its kernel `sm90/grouped_gemm.cu`), and which CUDA device a CubeCL
//! client is (`device.rs`). `cube/` calls in here where `R` is CubeCL's CUDA runtime.

pub(crate) mod batched;
pub mod cublaslt;
pub mod device;
pub mod gemm;
pub mod grouped;
pub mod sm90_grouped;

pub use device::is_cuda;
