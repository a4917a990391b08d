//! Marks in CubeCL's stream that the host can test without waiting (`StreamMark`): an event on
//! CubeCL's stream, or under `DeviceFlags` one on our stream after it has waited for CubeCL's.
//! They tell a queued copy to the host has arrived, and two timing marks give GPU time.

use std::sync::{Arc, Mutex};

use burn_lowp_kernels::cubecl::cuda::CudaRuntime;
use burn_lowp_kernels::cubecl::prelude::*;
use burn_lowp_kernels::cubecl::stream_id::StreamId;
use cudarc::driver::{sys as cuda, CudaContext};

use super::instance::{driver_error, CublasLt};
use super::ordering::{stream_ordering, StreamOrdering};
use super::run::{cubecl_server, CudaServer};
use crate::error::{LowpError, Result};

/// A point in CubeCL's calling stream that the host can test without waiting: an event recorded
/// on CubeCL's stream (`CubeclStream`, `queue_stream_mark`), or under `DeviceFlags` on our stream
/// once it has waited (one READY handshake, as before a GEMM) until CubeCL's stream has passed
/// the point. CubeCL's read futures can only be waited on; this lets a copy to the host queued
/// before the mark be known to have arrived (`host_copy::HostCopy::try_get`) without a waiting
/// thread.
pub struct StreamMark {
    ctx: Arc<CudaContext>,
    event: cudarc::driver::CudaEvent,
}

impl StreamMark {
    /// Whether CubeCL's stream has passed the mark (never waits; false on a CUDA error).
    pub fn reached(&self) -> bool {
        self.ctx.bind_to_thread().is_ok() && self.event.try_is_complete().unwrap_or(false)
    }

    /// GPU seconds from `start` to this mark, both queued by [`queue_timing_mark`] on one CubeCL
    /// stream; waits until the GPU has passed this mark.
    pub fn seconds_since(&self, start: &StreamMark) -> Result<f64> {
        self.ctx.bind_to_thread().map_err(driver_error("bind context"))?;
        self.event.synchronize().map_err(driver_error("event synchronize"))?;
        let ms = start.event.elapsed_ms(&self.event).map_err(driver_error("event elapsed time"))?;
        Ok(ms as f64 / 1e3)
    }
}

/// Under `CubeclStream`: queues on CubeCL's device thread, behind what this thread has queued,
/// a task that puts into `slot` a mark of the calling CubeCL stream at that point (see
/// `StreamMark`; `None` if the event cannot be recorded).
pub fn queue_stream_mark(device: usize, slot: Arc<Mutex<Option<StreamMark>>>) {
    queue_mark(device, slot, cuda::CUevent_flags::CU_EVENT_DISABLE_TIMING);
}

/// A mark of the calling CubeCL stream, as [`queue_stream_mark`], whose event keeps its time:
/// two of them give the GPU time between two points of the stream (`StreamMark::seconds_since`),
/// as `torch.cuda.Event(enable_timing=True)` does for PyTorch; GEMMs on our streams count too,
/// since CubeCL's stream waits for them. The slot is filled once CubeCL's device thread has run
/// what was queued before (certainly after a `client.sync()`).
pub fn queue_timing_mark(device: usize, slot: Arc<Mutex<Option<StreamMark>>>) {
    queue_mark(device, slot, cuda::CUevent_flags::CU_EVENT_DEFAULT);
}

fn queue_mark(device: usize, slot: Arc<Mutex<Option<StreamMark>>>, flags: cuda::CUevent_flags) {
    cubecl_server(device).submit(move |server: &mut CudaServer| {
        let mark = server
            .stream_for_external_work(StreamId::current(), Vec::new())
            .map_err(|e| LowpError::invalid("CubeCL", "stream", format!("{e:?}")))
            .and_then(|(stream, _)| {
                CublasLt::with(device, |lt| {
                    lt.ctx.bind_to_thread().map_err(driver_error("bind context"))?;
                    let event = lt.ctx.new_event(Some(flags)).map_err(driver_error("event"))?;
                    unsafe { cuda::cuEventRecord(event.cu_event(), stream) }
                        .result()
                        .map_err(driver_error("record event on CubeCL's stream"))?;
                    Ok(StreamMark {
                        ctx: lt.ctx.clone(),
                        event,
                    })
                })
            });
        if let Ok(mut slot) = slot.lock() {
            *slot = mark.ok();
        }
    });
}

/// Under `DeviceFlags`: marks the calling CubeCL stream at what it has queued so far (see
/// `StreamMark`). Call on CubeCL's device thread, from one of our tasks (`DeviceTasks`), as the
/// GEMMs do. `None` under other orderings or if the mark cannot be queued (nothing is then left
/// waiting: our stream's wait is the last thing queued).
pub fn mark_cubecl_stream(client: &ComputeClient<CudaRuntime>, device: usize) -> Option<StreamMark> {
    if stream_ordering() != StreamOrdering::DeviceFlags {
        return None;
    }
    CublasLt::with(device, |lt| {
        let (flags, flags_ptr, value) = lt.next_flag_value(client)?;
        burn_lowp_kernels::signal_flag(client, &flags, value);
        // Flushes CubeCL's queued launches (as `pin_buffers` does for a GEMM), so that the
        // signal is on the CUDA stream before our stream waits for it.
        drop(
            client
                .get_resource(flags)
                .map_err(|e| LowpError::invalid("CubeCL", "get_resource", format!("{e:?}")))?,
        );
        lt.wait_ready(flags_ptr, value)?;
        let event = lt
            .main_stream()
            .record_event(Some(cuda::CUevent_flags::CU_EVENT_DISABLE_TIMING))
            .map_err(driver_error("event"))?;
        Ok(StreamMark {
            ctx: lt.ctx.clone(),
            event,
        })
    })
    .ok()
}
