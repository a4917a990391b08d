//! Device-to-host reads on `CubeBackend` that do not block the training thread: a read request
//! queued as a task on CubeCL's device thread (`HostRead`), and on CUDA a mark after its copies
//! that tells, without waiting, whether they have arrived (the grouped split sizes' `HostCopy`).
//! `DeviceTasks` is our own service on that thread, also used by the cuBLASLt GEMM groups.

use std::sync::{Arc, Mutex};

use burn_cubecl::CubeRuntime;
use burn_lowp_kernels::cubecl::device::{Device, DeviceId, DeviceService, ServerUtilitiesHandle};
use burn_lowp_kernels::cubecl::device_handle::DeviceHandle;
use burn_lowp_kernels::cubecl::prelude::*;
use burn_lowp_kernels::cubecl::server::Handle;

use super::CubeBytes;
use crate::backend::host_copy::Arrived;
use crate::error::{LowpError, Result};

/// A host read in flight: the bytes, once the copies are done.
type PendingRead = std::pin::Pin<
    Box<
        dyn std::future::Future<
                Output = std::result::Result<
                    Vec<burn_lowp_kernels::cubecl::bytes::Bytes>,
                    burn_lowp_kernels::cubecl::server::ServerError,
                >,
            > + Send,
    >,
>;

/// Starts reading `handles` into pinned host memory (CubeCL queues the copies on the stream now)
/// and returns the future that waits for them.
fn read_later<R: CubeRuntime>(client: &ComputeClient<R>, handles: Vec<Handle>) -> PendingRead {
    let future = Box::pin(client.read_async(handles));
    // SAFETY: cubecl-runtime 0.10's `read_async` returns `self.do_read(..)`, a boxed `'static`
    // future that owns what it reads (the copies are queued before it returns); the `'_` in its
    // signature is only edition 2024's capture of `&self`. The client it came from is an `Arc`
    // handle that outlives the future wherever it is kept (`bytes_to_host_later` keeps a clone).
    unsafe { std::mem::transmute(future as std::pin::Pin<Box<dyn std::future::Future<Output = _> + Send + '_>>) }
}

/// A device-to-host read whose copies CubeCL's device thread queues when it reaches the request
/// in its task queue. `ComputeClient::read_async` itself is a blocking round trip: it flushes
/// the queue and waits for the device thread to launch everything before it (16 times per MoE
/// step, one per layer and micro-batch, for the grouped GEMMs' splits). Submitted as a task, the
/// request costs the training thread nothing; the copies still follow their producers on the
/// stream.
struct HostRead {
    future: Arc<Mutex<Option<PendingRead>>>,
    queue: DeviceHandle<DeviceTasks>,
    /// On CUDA, when asked for: a mark after the copies, to tell they have arrived without
    /// waiting (`cublaslt::StreamMark`), set when the device thread queues them.
    #[cfg(feature = "cuda")]
    mark: Option<Arc<Mutex<Option<crate::backend::cuda::cublaslt::StreamMark>>>>,
    /// Off CUDA, a read dropped unawaited is completed first: cubecl-wgpu 0.10 hands the
    /// staging buffer of a dropped read back to its pool while it is still mapped, and the next
    /// read that takes it fails wgpu's validation ("buffer still mapped"). A `GroupLayout`
    /// dropped before anyone read its splits did that.
    complete_on_drop: bool,
    /// `future` took the read (nothing left to complete).
    taken: bool,
}

impl Drop for HostRead {
    fn drop(&mut self) {
        if !self.complete_on_drop || self.taken {
            return;
        }
        // The device thread may not have queued the read yet: wait until it has.
        let _ = self.queue.submit_blocking(|_| ());
        if let Some(pending) = self.future.lock().expect("host read slot").take() {
            let _ = burn_lowp_kernels::cubecl::future::block_on(pending);
        }
    }
}

/// Our own tasks on CubeCL's device thread of a device (host reads here, cuBLASLt GEMM groups in
/// `cuda::cublaslt`): they run on that thread in order with CubeCL's own (one queue per device and
/// stage), but borrow only this empty state. A task submitted for CubeCL's server would hold the
/// server's state while it runs, and the CubeCL calls such a task makes (the GEMM handshake's
/// flag kernels and `get_resource`, `read_async`), which run inline on that thread, borrow it
/// again: the first such task panicked with the state already borrowed.
pub(crate) struct DeviceTasks;

impl DeviceService for DeviceTasks {
    fn init(_device: DeviceId) -> Self {
        DeviceTasks
    }

    fn utilities(&self) -> ServerUtilitiesHandle {
        Arc::new(())
    }
}

impl HostRead {
    /// `marked`: also queue a `StreamMark` after the copies (on CUDA; ignored elsewhere).
    fn request<R: CubeRuntime>(
        client: ComputeClient<R>,
        device: &R::Device,
        handles: Vec<Handle>,
        marked: bool,
    ) -> Self {
        let future = Arc::new(Mutex::new(None));
        let slot = future.clone();
        let queue = DeviceHandle::<DeviceTasks>::new(device.to_id());
        // (The mark's slot, and the CUDA device it is made on.)
        #[cfg(feature = "cuda")]
        let mark = (marked && crate::backend::cuda::is_cuda::<R>())
            .then(|| (Arc::new(Mutex::new(None)), crate::backend::cuda::device::cuda_device::<R>(device)));
        #[cfg(not(feature = "cuda"))]
        let _ = marked;
        // Under `DeviceFlags` the mark is made in the read's task (it launches CubeCL kernels);
        // under `CubeclStream` by a task of CubeCL's server queued right behind it.
        #[cfg(feature = "cuda")]
        let ordering = crate::backend::cuda::cublaslt::stream_ordering();
        #[cfg(feature = "cuda")]
        let task_mark = mark
            .clone()
            .filter(|_| ordering == crate::backend::cuda::cublaslt::StreamOrdering::DeviceFlags);
        // On the device thread, `read_async`'s own blocking call runs inline.
        queue.submit(move |_| {
            *slot.lock().expect("host read slot") = Some(read_later(&client, handles));
            #[cfg(feature = "cuda")]
            if let Some((mark, device)) = task_mark {
                let cuda = crate::backend::cuda::device::cuda_client(&client);
                *mark.lock().expect("host read mark") = crate::backend::cuda::cublaslt::mark_cubecl_stream(cuda, device);
            }
        });
        #[cfg(feature = "cuda")]
        if let Some((mark, device)) = &mark {
            if ordering == crate::backend::cuda::cublaslt::StreamOrdering::CubeclStream {
                crate::backend::cuda::cublaslt::queue_stream_mark(*device, mark.clone());
            }
        }
        #[cfg(feature = "cuda")]
        let complete_on_drop = !crate::backend::cuda::is_cuda::<R>();
        #[cfg(not(feature = "cuda"))]
        let complete_on_drop = true;
        HostRead {
            future,
            queue,
            #[cfg(feature = "cuda")]
            mark: mark.map(|(mark, _)| mark),
            complete_on_drop,
            taken: false,
        }
    }

    /// Whether the copies have arrived, without waiting (`None` where no mark was asked for):
    /// false until the device thread has queued them, and where no mark could be made.
    fn arrived(&self) -> Option<Arrived> {
        #[cfg(feature = "cuda")]
        if let Some(mark) = self.mark.clone() {
            return Some(Box::new(move || {
                mark.lock().expect("host read mark").as_ref().is_some_and(|m| m.reached())
            }));
        }
        None
    }

    /// The read's future; waits for the device thread to reach the request if it has not yet.
    fn future(mut self) -> Result<PendingRead> {
        self.taken = true;
        if let Some(f) = self.future.lock().expect("host read slot").take() {
            return Ok(f);
        }
        self.queue
            .submit_blocking(|_| ())
            .map_err(|e| LowpError::invalid("device read", "request", format!("{e:?}")))?;
        self.future
            .lock()
            .expect("host read slot")
            .take()
            .ok_or_else(|| LowpError::invalid("device read", "request", "the device thread dropped it"))
    }
}

/// `BytesOps::bytes_to_host_later`; `marked`: on CUDA also a probe that tells, without
/// waiting, whether the copies have arrived (`HostRead`'s mark).
pub(crate) fn host_read_later<R: CubeRuntime>(
    bytes: Vec<CubeBytes<R>>,
    marked: bool,
) -> (
    Box<dyn FnOnce() -> Result<Vec<Vec<u8>>> + Send>,
    Option<Arrived>,
) {
    let Some(first) = bytes.first() else {
        return (Box::new(|| Ok(Vec::new())), None);
    };
    let client = first.client.clone();
    let lens: Vec<usize> = bytes.iter().map(|b| b.len).collect();
    let handles: Vec<Handle> = bytes.iter().map(|b| b.handle.clone()).collect();
    let pending = HostRead::request(client.clone(), &first.device, handles, marked);
    let arrived = pending.arrived();
    let wait = Box::new(move || {
        let data = burn_lowp_kernels::cubecl::future::block_on(pending.future()?)
            .map_err(|e| LowpError::invalid("device read", "failed", format!("{e:?}")))?;
        drop(client);
        Ok(data
            .into_iter()
            .zip(lens)
            .map(|(d, len)| d[..len].to_vec())
            .collect())
    });
    (wait, arrived)
}
