//! Where collectives run: a CUDA stream of ours, ordered against the stream the caller's CubeCL
//! work runs on without a host wait, by the mechanism the cuBLASLt GEMMs use
//! (`backend::cuda::external_work`: a task on CubeCL's device thread gets CubeCL's stream and the
//! buffers' pointers; our stream waits for an event recorded there, the collective is queued on
//! our stream, CubeCL's stream waits for an event recorded after it).
//!
//! `CollectiveStream` is the contract the collectives are written against; `CubeclStream` is
//! its CUDA implementation, which adds the rank's fault state: a failure once `submit` has
//! returned raises it. The buffers' handles are held until the join is queued, so their memory
//! cannot be handed to work that is not ordered after the collective.

use std::any::Any;
use std::sync::{Arc, Mutex};

use burn_lowp_kernels::cubecl::server::Handle;
use cudarc::driver::{sys as cuda, CudaContext, CudaStream, DriverError};

use super::fault::FaultState;
use crate::backend::cuda::external_work::{on_cubecl_stream, StreamFork};
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

    /// Queues `work` as `submit` does, but leaves CubeCL's stream free to go on: what it queues
    /// next is not ordered after `work` until `join`. Until then the caller must not give
    /// CubeCL any work on the buffers (the output of an all-reduce still running); they are
    /// held until the join. Data parallelism's reduction overlapped with backward.
    fn submit_unjoined(&self, buffers: Vec<Handle>, work: CollectiveWork) -> Result<()>;

    /// Orders what the calling thread queues on CubeCL next after all the work queued here so
    /// far (`submit_unjoined`'s included), and lets the held buffers go. Does not wait.
    fn join(&self) -> Result<()>;
}

/// `CollectiveStream` on CUDA, through CubeCL's device thread of one device.
pub struct CubeclStream {
    shared: Arc<Shared>,
}

struct Shared {
    device: usize,
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    events: Mutex<StreamFork>,
    fault: Arc<FaultState>,
    /// The buffers of unjoined work, held until `join` is queued.
    unjoined: Mutex<Vec<Handle>>,
}

fn driver(what: &'static str) -> impl Fn(DriverError) -> LowpError {
    move |e| LowpError::distributed(format!("CUDA driver: {what}: {e:?}"))
}

impl CubeclStream {
    /// A new stream of ours on CUDA device `device` (whose primary context `ctx` is, CubeCL's
    /// too, so pointers are shared).
    pub fn new(device: usize, ctx: Arc<CudaContext>, fault: Arc<FaultState>) -> Result<CubeclStream> {
        let stream = ctx.new_stream().map_err(driver("create the collective stream"))?;
        let events = StreamFork::new(&ctx).map_err(driver("create an event"))?;
        Ok(CubeclStream {
            shared: Arc::new(Shared {
                device,
                ctx,
                stream,
                events: Mutex::new(events),
                fault,
                unjoined: Mutex::new(Vec::new()),
            }),
        })
    }
}

impl CollectiveStream for CubeclStream {
    fn submit(&self, buffers: Vec<Handle>, work: CollectiveWork) -> Result<()> {
        self.queue(buffers, move |shared, resolved| shared.run(resolved, work, true))
    }

    fn submit_unjoined(&self, buffers: Vec<Handle>, work: CollectiveWork) -> Result<()> {
        self.shared.fault.check()?;
        lock(&self.shared.unjoined).extend(buffers.iter().cloned());
        self.queue(buffers, move |shared, resolved| shared.run(resolved, work, false))
    }

    fn join(&self) -> Result<()> {
        let held = std::mem::take(&mut *lock(&self.shared.unjoined));
        // The held buffers go with the task: dropped once CubeCL's stream waits for ours.
        self.queue(held, |shared, resolved| shared.join(resolved))
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl CubeclStream {
    /// Runs `task` on CubeCL's device thread with the stream of the calling thread's CubeCL work
    /// and `buffers`' pointers; a failure there raises the rank's fault state.
    fn queue(&self, buffers: Vec<Handle>, task: impl FnOnce(&Shared, Result<(cuda::CUstream, Vec<u64>)>) -> Result<()> + Send + 'static) -> Result<()> {
        self.shared.fault.check()?;
        let shared = self.shared.clone();
        on_cubecl_stream(shared.device, buffers, move |resolved| {
            let run = || task(&shared, resolved);
            let failure = match std::panic::catch_unwind(std::panic::AssertUnwindSafe(run)) {
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
    /// Queues `work` on our stream after CubeCL's, and CubeCL's after it when `join`.
    fn run(&self, resolved: Result<(cuda::CUstream, Vec<u64>)>, work: CollectiveWork, join: bool) -> Result<()> {
        let (cubecl, pointers) = resolved?;
        self.ctx.bind_to_thread().map_err(driver("bind the device's context"))?;
        let ours = self.stream.cu_stream();
        let events = lock(&self.events);
        events.fork(cubecl, ours).map_err(driver("order the collective stream after CubeCL's"))?;
        let queued = work(ours, &pointers);
        if !join {
            return queued;
        }
        // Joined even when the work failed part way: what it did queue must finish before
        // CubeCL's stream goes on.
        let joined = events.join(ours, cubecl).map_err(driver("order CubeCL's stream after the collective"));
        queued.and(joined)
    }

    /// Orders CubeCL's stream after everything queued on ours.
    fn join(&self, resolved: Result<(cuda::CUstream, Vec<u64>)>) -> Result<()> {
        let (cubecl, _) = resolved?;
        self.ctx.bind_to_thread().map_err(driver("bind the device's context"))?;
        let events = lock(&self.events);
        events.join(self.stream.cu_stream(), cubecl).map_err(driver("order CubeCL's stream after the collectives"))
    }
}

fn panic_message(payload: &(dyn Any + Send)) -> String {
    match (payload.downcast_ref::<&str>(), payload.downcast_ref::<String>()) {
        (Some(s), _) => s.to_string(),
        (_, Some(s)) => s.clone(),
        _ => "a panic without a message".to_string(),
    }
}
