//! Running a group of GEMMs on CubeCL's buffers: the task on CubeCL's device thread that
//! resolves the buffers' pointers, orders our streams against CubeCL's (`StreamOrdering`) and
//! queues the work, and the errors of tasks that failed after their call returned.

use std::any::Any;
use std::sync::Mutex;

use burn_lowp_kernels::cubecl::cuda::{CudaDevice, CudaRuntime};
use burn_lowp_kernels::cubecl::device::Device;
use burn_lowp_kernels::cubecl::device_handle::DeviceHandle;
use burn_lowp_kernels::cubecl::prelude::*;
use burn_lowp_kernels::cubecl::server::{Binding, Handle};
use burn_lowp_kernels::cubecl::stream_id::StreamId;

use super::external_stream::stream_for_external_work;
use super::instance::CublasLt;
use super::ordering::{set_stream_ordering, stream_ordering, StreamOrdering, CUBECL_MAX_POLLS};
use super::plan::{GroupWork, LtGemm, Plan};
use crate::backend::cube::DeviceTasks;
use crate::backend::gemm_profile::{self as profile, GemmPhase};
use crate::error::{LowpError, Result};

/// Drops device `device`'s cached GEMM plans (descriptors, layouts and chosen algorithms), so
/// that the next GEMM of each shape chooses again: from the tuning table (`gemm_tuning`, e.g. a
/// file loaded since) or by timing. Runs on CubeCL's device thread, after what is queued there.
pub fn reset_gemm_plans(device: usize) -> Result<()> {
    device_thread(device)
        .submit_blocking(move |_: &mut DeviceTasks| {
            CublasLt::with(device, |lt| {
                for (_, plan) in lt.plans.drain() {
                    unsafe { Plan::destroy(plan.desc, &[plan.a, plan.b, plan.d]) };
                }
                Ok(())
            })
        })
        .map_err(|e| LowpError::invalid("CubeCL", "device thread", format!("{e:?}")))?
}

/// Runs a GEMM on CubeCL buffers. `buffers` are every buffer the GEMM reads or writes; `build`
/// turns their device pointers (same order) into the GEMM.
///
/// Everything runs as one task on CubeCL's device thread, where CubeCL's own calls (launching
/// the flag kernels, pinning each buffer) execute inline instead of each being a blocking round
/// trip through its channel. It also means the cuBLASLt state lock is only ever taken on device
/// threads, never by a thread that then waits for one.
pub fn run_on_cubecl_buffers(
    client: &ComputeClient<CudaRuntime>,
    device: usize,
    buffers: &[&Handle],
    build: impl FnOnce(&[u64]) -> LtGemm + Send + 'static,
) -> Result<()> {
    run_group_on_cubecl_buffers(client, device, buffers, (), move |pointers| vec![build(pointers)])
}

/// Runs a group of GEMMs on CubeCL buffers with one handshake (see the module docs); `build`
/// turns the buffers' device pointers into the GEMMs, which spread over our streams; `keep`
/// (tensors whose memory the GEMMs read) lives until the GEMMs are queued.
///
/// With `DeviceFlags` ordering the call does not wait for CubeCL's device thread: the task is
/// queued behind the launches already queued (the operands' producers) and the calling thread
/// goes on queueing work, which the flags order after the GEMMs. (A blocking round trip per
/// call cost about a millisecond of wall clock in the MoE step, where the device thread has
/// usually gone to sleep between calls.) A failure on the device thread (a misaligned operand,
/// a cuBLASLt error) cannot be returned by this call: the group's outputs are then not written,
/// and the error is returned by the next GEMM call of the process, or by `deferred_gemm_error`.
/// `HostSync` ordering waits, as it must.
pub fn run_group_on_cubecl_buffers<K: Send + 'static>(
    client: &ComputeClient<CudaRuntime>,
    device: usize,
    buffers: &[&Handle],
    keep: K,
    build: impl FnOnce(&[u64]) -> Vec<LtGemm> + Send + 'static,
) -> Result<()> {
    run_work_on_cubecl_buffers(client, device, buffers, keep, move |pointers| {
        build(pointers).into_iter().map(GroupWork::Lt).collect()
    })
}

/// `run_group_on_cubecl_buffers` for work that may include our Hopper grouped GEMM
/// (`GroupWork::Sm90`), which `build` chooses on CubeCL's device thread, when the pointers are
/// known.
pub fn run_work_on_cubecl_buffers<K: Send + 'static>(
    client: &ComputeClient<CudaRuntime>,
    device: usize,
    buffers: &[&Handle],
    keep: K,
    build: impl FnOnce(&[u64]) -> Vec<GroupWork> + Send + 'static,
) -> Result<()> {
    deferred_gemm_error()?;
    let handed = profile::start();
    let ordering = stream_ordering();
    if ordering == StreamOrdering::CubeclStream {
        let bindings: Vec<Binding> = buffers.iter().map(|h| (*h).clone().binding()).collect();
        cubecl_server(device).submit(move |server: &mut CudaServer| {
            let started = profile::record(GemmPhase::ToDeviceThread, handed);
            let run = || run_on_cubecl_stream(server, device, bindings, build, started);
            defer_failure(std::panic::catch_unwind(std::panic::AssertUnwindSafe(run)));
            drop(keep);
        });
        return Ok(());
    }
    if ordering == StreamOrdering::DeviceFlags {
        let handles: Vec<Handle> = buffers.iter().map(|h| (*h).clone()).collect();
        let task_client = client.clone();
        device_thread(device).submit(move |_: &mut DeviceTasks| {
            let started = profile::record(GemmPhase::ToDeviceThread, handed);
            let buffers: Vec<&Handle> = handles.iter().collect();
            let run = || run_on_device_thread(&task_client, device, &buffers, build, started, ordering);
            defer_failure(std::panic::catch_unwind(std::panic::AssertUnwindSafe(run)));
            drop(keep);
        });
        return Ok(());
    }
    let (result, finished) = client
        .exclusive(|| {
            let started = profile::record(GemmPhase::ToDeviceThread, handed);
            let result = run_on_device_thread(client, device, buffers, build, started, ordering);
            (result, profile::start())
        })
        .map_err(|e| LowpError::invalid("CubeCL", "device thread", format!("{e:?}")))?;
    profile::record(GemmPhase::FromDeviceThread, finished);
    drop(keep);
    result
}

/// The queue of CubeCL's device thread of CUDA device `device`, for our tasks.
fn device_thread(device: usize) -> DeviceHandle<DeviceTasks> {
    DeviceHandle::new(CudaDevice::new(device).to_id())
}

/// CubeCL's CUDA server of device `device`, the same queue and thread as `device_thread`; a task
/// submitted here holds the server, so it must not call CubeCL's client (which would borrow the
/// server again on this thread).
pub(super) type CudaServer = <CudaRuntime as Runtime>::Server;

pub(super) fn cubecl_server(device: usize) -> DeviceHandle<CudaServer> {
    DeviceHandle::new(CudaDevice::new(device).to_id())
}

/// Keeps a GEMM task's failure for the next GEMM call: a task queued without waiting cannot
/// return it, and a panic would otherwise be caught (and only logged) by CubeCL's channel.
fn defer_failure(outcome: std::thread::Result<Result<()>>) {
    match outcome {
        Ok(Ok(())) => {}
        Ok(Err(e)) => defer_gemm_error(e),
        Err(panic) => defer_gemm_error(LowpError::invalid(
            "cuBLASLt GEMM task",
            panic_message(panic.as_ref()),
            unallocated_hint(&panic_message(panic.as_ref())),
        )),
    }
}

/// What a GEMM task's panic says to the user. CubeCL allocates a buffer in a task of its own
/// device thread after the handle was made; when that allocation fails (out of GPU memory) the
/// task panics, CubeCL only logs "can't allocate buffer", and the handle's memory stays
/// unassigned, so the first GEMM that resolves it finds no memory for it ("couldn't find
/// resource for that handle: Memory page 0 doesn't exist", seen with a 4-GPU run out of memory,
/// H200, 2026-11-28). Said here, since the log line came long before.
fn unallocated_hint(message: &str) -> &'static str {
    if message.contains("couldn't find resource") {
        "panicked on CubeCL's device thread: one of its buffers was never allocated, which is what \
         CubeCL leaves after an allocation failed (look for \"can't allocate buffer\" above: the \
         GPU ran out of memory)"
    } else {
        "panicked on CubeCL's device thread"
    }
}

/// The text of a caught panic's payload.
fn panic_message(payload: &(dyn Any + Send)) -> String {
    match (payload.downcast_ref::<&str>(), payload.downcast_ref::<String>()) {
        (Some(s), _) => s.to_string(),
        (_, Some(s)) => s.clone(),
        _ => "a panic without a message".to_string(),
    }
}

/// The first error of a GEMM that failed on CubeCL's device thread since the last call.
static DEFERRED_ERROR: Mutex<Option<LowpError>> = Mutex::new(None);

fn defer_gemm_error(e: LowpError) {
    let mut slot = DEFERRED_ERROR.lock().unwrap_or_else(|p| p.into_inner());
    slot.get_or_insert(e);
}

/// Returns (and clears) the error of a GEMM that failed on CubeCL's device thread after its call
/// had returned (`run_group_on_cubecl_buffers`); its outputs were not written.
pub fn deferred_gemm_error() -> Result<()> {
    let mut slot = DEFERRED_ERROR.lock().unwrap_or_else(|p| p.into_inner());
    match slot.take() {
        Some(e) => Err(LowpError::invalid(
            "an earlier cuBLASLt GEMM",
            e,
            "failed on CubeCL's device thread after its call returned; its output was not written",
        )),
        None => Ok(()),
    }
}

/// A GEMM group on CubeCL's own stream (`StreamOrdering::CubeclStream`), run by a task that holds
/// CubeCL's server on its device thread.
fn run_on_cubecl_stream(
    server: &mut CudaServer,
    device: usize,
    bindings: Vec<Binding>,
    build: impl FnOnce(&[u64]) -> Vec<GroupWork>,
    started: Option<std::time::Instant>,
) -> Result<()> {
    let (stream, pointers) = stream_for_external_work(server, StreamId::current(), bindings)?;
    let t = profile::record(GemmPhase::Pin, started);
    let gemms = build(&pointers);
    check_aligned(&gemms)?;
    CublasLt::with(device, |lt| {
        lt.fork_from(stream)?;
        let t = profile::record(GemmPhase::WaitReady, t);
        let result = unsafe { lt.enqueue_group(&gemms) };
        let t = profile::record(GemmPhase::Enqueue, t);
        // Joined even if a GEMM could not be queued: the ones before it are.
        let joined = lt.join_into(stream);
        profile::record(GemmPhase::Done, t);
        result.and(joined)
    })
}

fn run_on_device_thread(
    client: &ComputeClient<CudaRuntime>,
    device: usize,
    buffers: &[&Handle],
    build: impl FnOnce(&[u64]) -> Vec<GroupWork>,
    started: Option<std::time::Instant>,
    ordering: StreamOrdering,
) -> Result<()> {
    CublasLt::with(device, |lt| match ordering {
        // (`CubeclStream` groups run in `run_on_cubecl_stream`; this arm would order one with the
        // host if it came here.)
        StreamOrdering::HostSync | StreamOrdering::CubeclStream => {
            let (pins, pointers) = pin_buffers(client, buffers)?;
            let gemms = build(&pointers);
            check_aligned(&gemms)?;
            let result = host_synchronized(client, lt, &gemms);
            drop(pins);
            result
        }
        StreamOrdering::DeviceFlags => {
            let (flags, flags_ptr, value) = lt.next_flag_value(client)?;
            // Queued behind the producers. CubeCL batches launches in a channel to its device
            // thread; the blocking `get_resource` calls below flush it, so the signal kernel is
            // on the CUDA stream before our stream starts waiting for it.
            burn_lowp_kernels::signal_flag(client, &flags, value);
            let t = profile::record(GemmPhase::Signal, started);
            let (pins, pointers) = pin_buffers(client, buffers)?;
            let gemms = build(&pointers);
            // Checked before the wait is queued: an error must not leave CubeCL's stream
            // waiting for a DONE that never comes (its wait kernel is queued only below).
            let aligned = check_aligned(&gemms);
            let t = profile::record(GemmPhase::Pin, t);
            let waiting = lt.wait_ready(flags_ptr, value);
            let t = profile::record(GemmPhase::WaitReady, t);
            if let Err(e) = waiting {
                eprintln!("burn-lowp: {e}; falling back to host-synchronized cuBLASLt ordering");
                set_stream_ordering(StreamOrdering::HostSync);
                let result = aligned.and_then(|_| host_synchronized(client, lt, &gemms));
                drop(pins);
                return result;
            }
            let result = aligned.and_then(|_| unsafe { lt.enqueue_group(&gemms) });
            let t = profile::record(GemmPhase::Enqueue, t);
            // DONE is written even if the GEMM could not be queued, so that CubeCL's stream is
            // never held for a GEMM that will not run.
            match lt.signal_done(flags_ptr, value) {
                Ok(()) => burn_lowp_kernels::wait_flag(client, &flags, value, CUBECL_MAX_POLLS),
                Err(e) => {
                    // Without DONE a wait kernel would spin until it gives up: order with the
                    // host instead.
                    lt.synchronize()?;
                    return Err(e);
                }
            }
            // Safe to unpin now: CubeCL's stream cannot run anything that reuses this memory
            // before its wait kernel has seen the GEMM finish.
            drop(pins);
            profile::record(GemmPhase::Done, t);
            result
        }
    })
}

fn pin_buffers(
    client: &ComputeClient<CudaRuntime>,
    buffers: &[&Handle],
) -> Result<(Vec<Box<dyn Any + Send>>, Vec<u64>)> {
    let mut pins: Vec<Box<dyn Any + Send>> = Vec::with_capacity(buffers.len());
    let mut pointers = Vec::with_capacity(buffers.len());
    for handle in buffers {
        let pin = client
            .get_resource((*handle).clone())
            .map_err(|e| LowpError::invalid("CubeCL", "get_resource", format!("{e:?}")))?;
        pointers.push(pin.resource().ptr);
        pins.push(Box::new(pin));
    }
    Ok((pins, pointers))
}

/// cuBLASLt reads and writes matrices at 16-byte aligned addresses (scales need not be); our
/// Hopper grouped GEMM needs the same of its matrices, and 4-byte aligned offsets and scales.
fn check_aligned(gemms: &[GroupWork]) -> Result<()> {
    for work in gemms {
        match work {
            GroupWork::Lt(g) => {
                let matrices = [Some(g.a.ptr), Some(g.b.ptr), Some(g.d), g.c];
                if let Some(p) = matrices.into_iter().flatten().find(|p| p % 16 != 0) {
                    return Err(LowpError::invalid(
                        "GEMM operand",
                        format!("address {p:#x}"),
                        "cuBLASLt needs 16-byte aligned matrices",
                    ));
                }
            }
            GroupWork::Sm90(g) => {
                if let Some(p) = g.misaligned() {
                    return Err(LowpError::invalid(
                        "grouped GEMM operand",
                        format!("address {p:#x}"),
                        "the sm90 grouped GEMM needs 16-byte aligned matrices and 4-byte aligned \
                         group offsets and scales",
                    ));
                }
            }
            GroupWork::Sm90Wgrad(g) => {
                if let Some(p) = g.misaligned() {
                    return Err(LowpError::invalid(
                        "grouped wgrad operand",
                        format!("address {p:#x}"),
                        "the sm90 grouped wgrad needs 16-byte aligned operands, an 8-byte (f32) or \
                         4-byte (bf16) aligned output and 4-byte aligned group offsets",
                    ));
                }
            }
        }
    }
    Ok(())
}

fn host_synchronized(
    client: &ComputeClient<CudaRuntime>,
    lt: &mut CublasLt,
    gemms: &[GroupWork],
) -> Result<()> {
    burn_lowp_kernels::cubecl::future::block_on(client.sync())
        .map_err(|e| LowpError::invalid("CubeCL", "sync", format!("{e:?}")))?;
    unsafe { lt.enqueue_group(gemms)? };
    lt.synchronize()
}
