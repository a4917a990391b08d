//! Where collectives run: a CUDA stream of ours, ordered against the stream the caller's CubeCL
//! work runs on without a host wait, as the cuBLASLt GEMMs are (`backend::cublaslt`,
//! `StreamOrdering::CubeclStream`).
//!
//! `CollectiveStream` is the contract the collectives are written against; `CubeclStream` is
//! its CUDA implementation. Its one dependency on CubeCL's internals is the method the vendored
//! `cubecl-cuda` adds for the GEMMs, `CudaServer::stream_for_external_work`, called from a task
//! on CubeCL's device thread: it names the CUDA stream of the calling thread's CubeCL work and
//! resolves the buffers' device pointers as a kernel launch would. The task records an event
//! there and our stream waits for it (the fork), the collective is queued on our stream, and
//! CubeCL's stream waits for an event recorded after it (the join): four driver calls, no host
//! wait, no kernel. Whatever CubeCL queues afterwards (a read of the result, a kernel that reuses
//! the buffers' memory once their handles are dropped) runs after the collective. The buffers'
//! handles are held until the join is queued, so their memory cannot be handed to work that is
//! not ordered after the collective.
//!
//! The fork/join pair is the same as `CublasLt::fork_from`/`join_into`; once the backend's
//! stream ordering is its own module, both can share it.

use std::any::Any;
use std::sync::{Arc, Mutex};

use burn_lowp_kernels::cubecl::cuda::{CudaDevice, CudaRuntime};
use burn_lowp_kernels::cubecl::device::Device;
use burn_lowp_kernels::cubecl::device_handle::DeviceHandle;
use burn_lowp_kernels::cubecl::prelude::*;
use burn_lowp_kernels::cubecl::server::{Binding, Handle};
use burn_lowp_kernels::cubecl::stream_id::StreamId;
use cudarc::driver::{sys as cuda, CudaContext, CudaEvent, CudaStream};

use super::fault::FaultState;
use crate::error::{LowpError, Result};

/// A collective to queue: given our stream and the device pointers of the submitted buffers (in
/// their order), it queues NCCL work on that stream.
pub type CollectiveWork = Box<dyn FnOnce(cuda::CUstream, &[u64]) -> Result<()> + Send>;

/// Runs collectives on a stream ordered after, and joined back into, the caller's CubeCL stream.
pub trait CollectiveStream: Send + Sync {
    /// Queues `work` after everything the calling thread has queued on CubeCL so far, and
    /// everything it queues later after `work`. Does not wait. `buffers` are every buffer the
    /// work reads or writes, held until CubeCL's stream is ordered after it. A failure once the
    /// call has returned raises the rank's fault state.
    fn submit(&self, buffers: Vec<Handle>, work: CollectiveWork) -> Result<()>;
}

type CudaServer = <CudaRuntime as Runtime>::Server;

/// `CollectiveStream` on CUDA, through CubeCL's device thread of one device.
pub struct CubeclStream {
    shared: Arc<Shared>,
}

struct Shared {
    device: usize,
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    /// Fork and join events: a wait takes the event as last recorded when the wait is queued,
    /// so two events serve every collective (as for the GEMMs).
    events: Mutex<(CudaEvent, CudaEvent)>,
    fault: Arc<FaultState>,
}

impl CubeclStream {
    /// A new stream of ours on CUDA device `device` (whose primary context `ctx` is, CubeCL's
    /// too, so pointers are shared).
    pub fn new(device: usize, ctx: Arc<CudaContext>, fault: Arc<FaultState>) -> Result<CubeclStream> {
        let driver = |what: &'static str| move |e: cudarc::driver::DriverError| LowpError::distributed(format!("CUDA driver: {what}: {e:?}"));
        let stream = ctx.new_stream().map_err(driver("create the collective stream"))?;
        let no_timing = Some(cuda::CUevent_flags::CU_EVENT_DISABLE_TIMING);
        let fork = ctx.new_event(no_timing).map_err(driver("create an event"))?;
        let join = ctx.new_event(no_timing).map_err(driver("create an event"))?;
        Ok(CubeclStream {
            shared: Arc::new(Shared {
                device,
                ctx,
                stream,
                events: Mutex::new((fork, join)),
                fault,
            }),
        })
    }
}

impl CollectiveStream for CubeclStream {
    fn submit(&self, buffers: Vec<Handle>, work: CollectiveWork) -> Result<()> {
        self.shared.fault.check()?;
        let shared = self.shared.clone();
        let server: DeviceHandle<CudaServer> = DeviceHandle::new(CudaDevice::new(shared.device).to_id());
        server.submit(move |server: &mut CudaServer| {
            let bindings: Vec<Binding> = buffers.iter().map(|h| h.clone().binding()).collect();
            let run = || shared.run(server, bindings, work);
            let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(run));
            drop(buffers);
            let failure = match outcome {
                Ok(Ok(())) => return,
                Ok(Err(e)) => e.to_string(),
                Err(panic) => format!("panicked: {}", panic_message(panic.as_ref())),
            };
            shared.fault.raise(format!("a collective failed on CubeCL's device thread: {failure}"));
        });
        Ok(())
    }
}

impl Shared {
    fn run(&self, server: &mut CudaServer, bindings: Vec<Binding>, work: CollectiveWork) -> Result<()> {
        let (cubecl, pointers) = server
            .stream_for_external_work(StreamId::current(), bindings)
            .map_err(|e| LowpError::distributed(format!("CubeCL: the collective's buffers: {e:?}")))?;
        let driver = |what: &'static str| move |e: cudarc::driver::DriverError| LowpError::distributed(format!("CUDA driver: {what}: {e:?}"));
        self.ctx.bind_to_thread().map_err(driver("bind the device's context"))?;
        let ours = self.stream.cu_stream();
        let events = self.events.lock().unwrap_or_else(|p| p.into_inner());
        let (fork, join) = (&events.0, &events.1);
        unsafe {
            cuda::cuEventRecord(fork.cu_event(), cubecl)
                .result()
                .map_err(driver("record an event on CubeCL's stream"))?;
            cuda::cuStreamWaitEvent(ours, fork.cu_event(), 0)
                .result()
                .map_err(driver("order the collective stream after CubeCL's"))?;
        }
        let queued = work(ours, &pointers);
        // Joined even when the work failed part way: what it did queue must finish before
        // CubeCL's stream goes on.
        let joined = unsafe {
            cuda::cuEventRecord(join.cu_event(), ours)
                .result()
                .and_then(|_| cuda::cuStreamWaitEvent(cubecl, join.cu_event(), 0).result())
                .map_err(driver("order CubeCL's stream after the collective"))
        };
        queued.and(joined)
    }
}

fn panic_message(payload: &(dyn Any + Send)) -> String {
    match (payload.downcast_ref::<&str>(), payload.downcast_ref::<String>()) {
        (Some(s), _) => s.to_string(),
        (_, Some(s)) => s.clone(),
        _ => "a panic without a message".to_string(),
    }
}
