//! How cuBLASLt's streams are ordered against CubeCL's stream (`StreamOrdering`, see the module
//! docs of `cublaslt`): the setting, the event fork and join of `CubeclStream`, and the device
//! flags and wait kernels of `DeviceFlags`.

use std::any::Any;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;

use burn_lowp_kernels::cubecl::cuda::CudaRuntime;
use burn_lowp_kernels::cubecl::prelude::*;
use burn_lowp_kernels::cubecl::server::Handle;
use burn_lowp_kernels::cubecl::stream_id::StreamId;
use burn_lowp_kernels::util::stream_flags::{DONE, FLAG_WORDS, TIMED_OUT};
use cudarc::driver::{sys as cuda, CudaStream, PushKernelArg};

use super::external_stream::cubecl_stream_available;
use super::instance::{driver_error, CublasLt};
use crate::backend::cuda::external_work::order_after;
use crate::error::{LowpError, Result};

/// How a cuBLASLt GEMM is ordered against CubeCL's stream (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamOrdering {
    CubeclStream,
    DeviceFlags,
    HostSync,
}

/// The ordering in use, as its code (`StreamOrdering::code`); `UNRESOLVED` until the first call
/// to `stream_ordering` or `set_stream_ordering`.
pub(super) static ORDERING: AtomicU8 = AtomicU8::new(UNRESOLVED);

pub(super) const UNRESOLVED: u8 = u8::MAX;

impl StreamOrdering {
    fn code(self) -> u8 {
        match self {
            StreamOrdering::DeviceFlags => 0,
            StreamOrdering::HostSync => 1,
            StreamOrdering::CubeclStream => 2,
        }
    }
}

/// The ordering in use: set by `set_stream_ordering`, else `LOWP_STREAM_ORDERING=host-sync` or
/// `=device-flags`, else `CubeclStream`. The variable is read once per process (every GEMM call
/// asks, and reading it takes the environment's lock and allocates). `CubeclStream` needs the
/// vendored `cubecl-cuda` (`cubecl_stream_available`); without it `DeviceFlags` stands in.
pub fn stream_ordering() -> StreamOrdering {
    match ORDERING.load(Ordering::Relaxed) {
        0 => StreamOrdering::DeviceFlags,
        1 => StreamOrdering::HostSync,
        2 => StreamOrdering::CubeclStream,
        _ => {
            let ordering = match std::env::var("LOWP_STREAM_ORDERING").as_deref() {
                Ok("host-sync") => StreamOrdering::HostSync,
                Ok("device-flags") => StreamOrdering::DeviceFlags,
                _ => StreamOrdering::CubeclStream,
            };
            let ordering = available(ordering);
            // A `set_stream_ordering` made meanwhile wins.
            let _ = ORDERING.compare_exchange(UNRESOLVED, ordering.code(), Ordering::Relaxed, Ordering::Relaxed);
            stream_ordering()
        }
    }
}

/// Sets the ordering from now on (`CubeclStream` gives `DeviceFlags` where this build's CubeCL
/// does not expose its stream).
pub fn set_stream_ordering(ordering: StreamOrdering) {
    ORDERING.store(available(ordering).code(), Ordering::Relaxed);
}

/// `ordering`, or `DeviceFlags` for a `CubeclStream` this build cannot run.
fn available(ordering: StreamOrdering) -> StreamOrdering {
    match ordering {
        StreamOrdering::CubeclStream if !cubecl_stream_available() => StreamOrdering::DeviceFlags,
        ordering => ordering,
    }
}

/// The device flags one CubeCL stream uses to order itself against ours.
pub(super) struct StreamFlags {
    pub(super) handle: Handle,
    pub(super) ptr: u64,
    /// The last value signalled; the next GEMM uses `counter + 1`.
    pub(super) counter: u32,
    /// Keeps the flag memory pinned (a CubeCL `ManagedResource`).
    pub(super) _pin: Box<dyn Any + Send>,
}

impl StreamFlags {
    /// A new flag buffer, zeroed on the device before this returns: our stream's wait kernel
    /// reads it outside CubeCL's stream order, so it must never see the pool memory's old bytes
    /// (a stale large READY would let a GEMM start before its producers). One host
    /// synchronization per CubeCL stream.
    pub(super) fn zeroed(client: &ComputeClient<CudaRuntime>) -> Result<Self> {
        let handle = client.create_from_slice(&[0u8; FLAG_WORDS * 4]);
        let pin = client
            .get_resource(handle.clone())
            .map_err(|e| LowpError::invalid("CubeCL", "get_resource", format!("{e:?}")))?;
        burn_lowp_kernels::cubecl::future::block_on(client.sync())
            .map_err(|e| LowpError::invalid("CubeCL", "sync", format!("{e:?}")))?;
        crate::backend::host_sync::record_stream_setup();
        Ok(StreamFlags {
            handle,
            ptr: pin.resource().ptr,
            counter: 0,
            _pin: Box::new(pin),
        })
    }
}

/// Reads of DONE before CubeCL's wait kernel gives up (an atomic read takes 0.1-1 µs, so
/// several seconds; one GEMM takes milliseconds).
pub(super) const CUBECL_MAX_POLLS: u32 = 1 << 25;

/// Polls of READY before our stream's wait kernel gives up: with a 128 ns sleep between polls,
/// about ten seconds, far longer than CubeCL's queue ahead of a GEMM can take.
pub(super) const OUR_MAX_POLLS: u32 = 1 << 26;

impl CublasLt {
    /// Orders our main stream after what `stream` (CubeCL's) has queued so far.
    pub(super) fn fork_from(&mut self, stream: cuda::CUstream) -> Result<()> {
        self.ctx.bind_to_thread().map_err(driver_error("bind context"))?;
        order_after(&self.fork, self.main_stream().cu_stream(), stream).map_err(driver_error("wait for CubeCL's stream"))
    }

    /// Orders what `stream` (CubeCL's) queues next after what our main stream has queued.
    pub(super) fn join_into(&mut self, stream: cuda::CUstream) -> Result<()> {
        order_after(&self.join, stream, self.main_stream().cu_stream()).map_err(driver_error("CubeCL's stream waits for ours"))
    }

    /// The flags of the calling thread's CubeCL stream on `client`, created on first use.
    pub(super) fn stream_flags(&mut self, client: &ComputeClient<CudaRuntime>) -> Result<&mut StreamFlags> {
        let stream = StreamId::current().value;
        if !self.flags.contains_key(&stream) {
            let flags = StreamFlags::zeroed(client)?;
            self.flags.insert(stream, flags);
        }
        Ok(self.flags.get_mut(&stream).expect("inserted above"))
    }

    /// The flag buffer of the caller's CubeCL stream and the value the next GEMM signals with.
    pub(super) fn next_flag_value(
        &mut self,
        client: &ComputeClient<CudaRuntime>,
    ) -> Result<(Handle, u64, u32)> {
        let lt = &*self;
        let streams: Vec<Arc<CudaStream>> = lt.lanes.iter().map(|l| l.stream.clone()).collect();
        let flags = self.stream_flags(client)?;
        if flags.counter == u32::MAX {
            // Values must only grow: after 2^32 GEMMs, drain both streams and start over with a
            // fresh zeroed buffer.
            burn_lowp_kernels::cubecl::future::block_on(client.sync())
                .map_err(|e| LowpError::invalid("CubeCL", "sync", format!("{e:?}")))?;
            for stream in &streams {
                stream.synchronize().map_err(driver_error("stream sync"))?;
            }
            *flags = StreamFlags::zeroed(client)?;
        }
        flags.counter += 1;
        Ok((flags.handle.clone(), flags.ptr, flags.counter))
    }

    /// Queues on our stream a one-thread kernel that returns once READY of the flags at `flags`
    /// reaches `value` (or records `value` in TIMED_OUT after `OUR_MAX_POLLS` polls).
    pub(super) fn wait_ready(&mut self, flags: u64, value: u32) -> Result<()> {
        let function = self.our_kernels()?.wait_ready.clone();
        let max_polls = OUR_MAX_POLLS;
        let stream = self.main_stream().clone();
        let mut launch = stream.launch_builder(&function);
        launch.arg(&flags).arg(&value).arg(&max_polls);
        unsafe {
            launch.launch(cudarc::driver::LaunchConfig {
                grid_dim: (1, 1, 1),
                block_dim: (1, 1, 1),
                shared_mem_bytes: 0,
            })
        }
        .map(|_| ())
        .map_err(driver_error("launch wait kernel"))
    }

    /// Queues on our stream the write of `value` to DONE of the flags at `flags`.
    pub(super) fn signal_done(&self, flags: u64, value: u32) -> Result<()> {
        self.ctx
            .bind_to_thread()
            .map_err(driver_error("bind context"))?;
        unsafe {
            cuda::cuMemsetD32Async(
                flags + (DONE * 4) as u64,
                value,
                1,
                self.main_stream().cu_stream(),
            )
        }
        .result()
        .map_err(driver_error("cuMemsetD32Async"))
    }
}

/// Reads the TIMED_OUT word of the calling stream's flags (synchronizes): 0 unless a wait kernel
/// gave up, in which case it is the value of the GEMM it gave up on. For tests and diagnostics.
pub fn timed_out_gemm(client: &ComputeClient<CudaRuntime>, device: usize) -> Result<u32> {
    let handle = client
        .exclusive(|| CublasLt::with(device, |lt| Ok(lt.stream_flags(client)?.handle.clone())))
        .map_err(|e| LowpError::invalid("CubeCL", "device thread", format!("{e:?}")))??;
    let bytes = client
        .read_one(handle)
        .map_err(|e| LowpError::invalid("CubeCL", "read flags", format!("{e:?}")))?;
    Ok(u32::from_le_bytes(
        bytes[TIMED_OUT * 4..TIMED_OUT * 4 + 4]
            .try_into()
            .expect("4 bytes"),
    ))
}
