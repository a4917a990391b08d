//! CUDA-only code of `CubeBackend`: GEMMs through cuBLASLt on the buffers CubeCL owns
//! (`cublaslt/`: plans, algorithm choice, stream ordering against CubeCL's stream, marks, our
//! streams' kernels), the operands laid out for it (`gemm.rs`: one GEMM or a group of them;
//! `batched.rs`: strided batches; `grouped.rs`: grouped MoE GEMMs), our Hopper grouped GEMM
//! (`sm90_grouped.rs` with its kernels `sm90/grouped_gemm.cu`; `sm90_wgrad.rs`, the K-grouped
//! weight gradient of the same file), which CUDA device a CubeCL client is (`device.rs`), which
//! paths this build and device take (`paths.rs`), the environment settings (`setting.rs`), and
//! other work of ours on CubeCL's buffers ordered against CubeCL's stream as the GEMMs are
//! (`external_work.rs`: the collectives of several GPUs). `cube/` calls in here where `R` is
//! CubeCL's CUDA runtime.

pub(crate) mod batched;
pub mod cublaslt;
pub mod device;
pub mod external_work;
pub mod gemm;
pub mod grouped;
pub mod paths;
mod grouped_wgrad;
mod setting;
pub mod sm90_grouped;
pub mod sm90_wgrad;

pub use device::is_cuda;
pub use paths::active_paths;
