//! cuBLASLt GEMMs on CUDA, on the device buffers CubeCL owns. Stream interop lives here and
//! nowhere else.
//!
//! cuBLASLt runs on streams of ours, ordered against CubeCL's stream one of three ways
//! (`StreamOrdering`):
//! * `CubeclStream` (default, no host synchronization, no extra kernels): the GEMM task runs on
//!   CubeCL's device thread with CubeCL's server in hand, which (through the one method our
//!   vendored `cubecl-cuda` adds, `CudaServer::stream_for_external_work`) names the CUDA stream
//!   the caller's CubeCL work runs on and resolves the operands' pointers as a kernel launch
//!   would. Our stream waits for an event recorded there, the GEMMs run, and CubeCL's stream
//!   waits for an event recorded after them: four driver calls, nothing resident on an SM.
//!   Only where that method exists (`external_stream.rs`): a crate built against the published
//!   `cubecl-cuda` gets `DeviceFlags` instead.
//! * `DeviceFlags` (what CubeCL 0.10 as published allows: it does not expose its stream): a
//!   one-thread CubeCL kernel writes a
//!   counter value to a device flag after the GEMM's producers; a one-thread kernel on our stream
//!   (NVRTC) waits for it, the GEMM runs, `cuMemsetD32Async` writes the value to a second flag,
//!   and a one-thread CubeCL kernel holds CubeCL's stream until it sees it. (The driver's
//!   `cuStreamWaitValue32` would avoid the first kernel, but it refuses CubeCL's pool memory.)
//!   Everything CubeCL queues afterwards (the consumers, and any reuse of the inputs' memory)
//!   runs after the GEMM. This assumes the GEMM's operands live on the calling thread's CubeCL
//!   stream, which is how Burn runs a training step.
//! * `HostSync` (fallback): pin the operands, `client.sync()`, run the GEMM, synchronize our
//!   stream. Two host round trips per GEMM; `benches/gemm.rs` measures what each ordering costs.
//! Both contexts are the device's primary context, so pointers are shared.
//!
//! A group of GEMMs that run together (a grouped GEMM's per-expert GEMMs) shares one ordering:
//! once our main stream is ordered after CubeCL's, it forks to `LANES` streams (each with its own
//! workspace), the GEMMs run round-robin on them, and the forks join our main stream before
//! CubeCL's is ordered after it. A GEMM may also be a cuBLASLt
//! pointer-array batch (`LtBatch`): a kernel of ours writes its pointer arrays on our stream from
//! the groups' device offsets, so the host never needs them. A group's work may also be our
//! Hopper grouped GEMM (`GroupWork::Sm90`, `sm90_grouped`), launched on the same streams in the
//! same place, so it is ordered exactly as the cuBLASLt GEMMs are.
//!
//! Under `DeviceFlags`, while a GEMM runs CubeCL's stream holds one SM with its wait kernel; a
//! plan made under that ordering therefore targets one SM less
//! (`CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET`), which measured free on its own and removes the
//! waiting kernel's 7-22% slowdown of large GEMMs
//! (MEASUREMENTS.md).
//!
//! Files: `external_stream.rs` (CubeCL's stream, where the build has it), `ordering.rs` (the orderings and their flags and events), `plan.rs` (a GEMM's
//! description and its cached descriptor and layouts), `algo.rs` (algorithm choice and tuning),
//! `instance.rs` (the per-device state and our streams), `run.rs` (the device-thread task that
//! runs a group), `marks.rs` (stream marks), `kernels.rs` with `stream_kernels.cu` (our streams'
//! kernels).

mod algo;
pub(crate) mod external_stream;
mod instance;
mod kernels;
mod marks;
mod ordering;
mod plan;
mod run;

pub use external_stream::cubecl_stream_available;
pub use instance::CublasLt;
pub use marks::{mark_cubecl_stream, queue_stream_mark, queue_timing_mark, StreamMark};
pub use ordering::{set_stream_ordering, stream_ordering, timed_out_gemm, StreamOrdering};
pub use plan::{pointer_array_bytes, GroupWork, LtBatch, LtGemm, LtOperand, LtStrided, ScaleMode};
pub use run::{
    deferred_gemm_error, reset_gemm_plans, run_group_on_cubecl_buffers, run_on_cubecl_buffers,
    run_work_on_cubecl_buffers,
};
