//! Work of ours (not a CubeCL kernel) on CubeCL's buffers, ordered against CubeCL's stream
//! without a host wait: what the cuBLASLt GEMMs do under `StreamOrdering::CubeclStream`
//! (`cublaslt::run`), for other callers (the collectives of several GPUs).
//!
//! A task on CubeCL's device thread, with CubeCL's server in hand, asks the one method our
//! vendored `cubecl-cuda` adds, `CudaServer::stream_for_external_work`, for the CUDA stream of
//! the caller's CubeCL work and the buffers' device pointers (resolved as a kernel launch would
//! resolve them). Our stream waits for an event recorded there (`StreamFork::fork`), the work is
//! queued on our stream, and CubeCL's stream waits for an event recorded after it
//! (`StreamFork::join`): four driver calls, nothing resident on an SM. Whatever CubeCL queues
//! afterwards (a read of a result, a kernel reusing the buffers' memory once their handles are
//! dropped) runs after the work.

use std::sync::Arc;

use burn_lowp_kernels::cubecl::cuda::{CudaDevice, CudaRuntime};
use burn_lowp_kernels::cubecl::device::Device;
use burn_lowp_kernels::cubecl::device_handle::DeviceHandle;
use burn_lowp_kernels::cubecl::prelude::*;
use burn_lowp_kernels::cubecl::server::{Binding, Handle};
use burn_lowp_kernels::cubecl::stream_id::StreamId;
use cudarc::driver::{sys as cuda, CudaContext, CudaEvent, DriverError};

use crate::error::Result;

type CudaServer = <CudaRuntime as Runtime>::Server;

/// Records `event` on `recorded` and has `waiter` wait for it: `waiter` runs what it queues next
/// after what `recorded` has queued so far. A wait takes the event as last recorded when the wait
/// is queued, so one event serves every fork (or join) of a stream pair.
pub fn order_after(event: &CudaEvent, waiter: cuda::CUstream, recorded: cuda::CUstream) -> std::result::Result<(), DriverError> {
    unsafe {
        cuda::cuEventRecord(event.cu_event(), recorded).result()?;
        cuda::cuStreamWaitEvent(waiter, event.cu_event(), 0).result()
    }
}

/// The fork and join events of one stream of ours against CubeCL's streams.
pub struct StreamFork {
    fork: CudaEvent,
    join: CudaEvent,
}

impl StreamFork {
    pub fn new(ctx: &Arc<CudaContext>) -> std::result::Result<StreamFork, DriverError> {
        let no_timing = Some(cuda::CUevent_flags::CU_EVENT_DISABLE_TIMING);
        Ok(StreamFork {
            fork: ctx.new_event(no_timing)?,
            join: ctx.new_event(no_timing)?,
        })
    }

    /// Orders `ours` after what `cubecl` has queued so far.
    pub fn fork(&self, cubecl: cuda::CUstream, ours: cuda::CUstream) -> std::result::Result<(), DriverError> {
        order_after(&self.fork, ours, cubecl)
    }

    /// Orders what `cubecl` queues next after what `ours` has queued so far.
    pub fn join(&self, ours: cuda::CUstream, cubecl: cuda::CUstream) -> std::result::Result<(), DriverError> {
        order_after(&self.join, cubecl, ours)
    }
}

/// Queues `task` on CubeCL's device thread of `device`, behind what the calling thread has queued
/// there; it gets the CUDA stream of the calling thread's CubeCL work and the device pointers of
/// `buffers` (in their order), or CubeCL's error. The handles are dropped after the task, so their
/// memory is not handed to other work before the task has ordered CubeCL's stream after its own.
/// Does not wait. The task runs on CubeCL's device thread with the server borrowed: it must not
/// call CubeCL's client.
pub fn on_cubecl_stream(
    device: usize,
    buffers: Vec<Handle>,
    task: impl FnOnce(Result<(cuda::CUstream, Vec<u64>)>) + Send + 'static,
) {
    let server: DeviceHandle<CudaServer> = DeviceHandle::new(CudaDevice::new(device).to_id());
    server.submit(move |server: &mut CudaServer| {
        let bindings: Vec<Binding> = buffers.iter().map(|h| h.clone().binding()).collect();
        // Without the vendored cubecl-cuda (a crate depending on burn-lowp without the README's
        // `[patch.crates-io]`) this is an error naming the missing patch.
        let resolved = super::cublaslt::external_stream::stream_for_external_work(server, StreamId::current(), bindings);
        task(resolved);
        drop(buffers);
    });
}
