//! NCCL communicators over cudarc's raw bindings (`cudarc::nccl::sys`), on device pointers and
//! CUDA streams that the caller owns.
//!
//! cudarc's safe `Comm` works on its own `CudaSlice`s and `CudaStream`, and panics in `Drop` if
//! the abort fails; burn-lowp's buffers belong to CubeCL and its collectives run on a stream
//! ordered against CubeCL's (`collective_stream`), so this wraps the raw calls instead.
//!
//! Every communicator is non-blocking (`ncclConfig_t::blocking = 0`): no NCCL call waits on the
//! host for a peer. A call that must (initialisation, the first send/recv to a peer,
//! which connects) returns `ncclInProgress`, and this module polls `ncclCommGetAsyncError` until
//! it is done, the run's timeout passes, or the rank's fault state is raised (a dead peer seen
//! by the liveness channel); a blocking communicator would hang there instead. A raised fault
//! aborts every communicator (`ncclCommAbort`, registered as a hook), which also ends NCCL's
//! kernels still waiting for a dead peer. Each queued collective is handed to the watchdog
//! with an event recorded after it.

use std::ffi::{c_void, CStr};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use cudarc::driver::{sys as cuda, CudaContext, CudaEvent};
use cudarc::nccl::sys;
use sys::ncclResult_t as Code;

use super::fault::FaultState;
use super::grad_reduce::ReduceOp;
use super::nccl_version::{NcclVersion, BINDINGS_NCCL};
use super::watchdog::{Completion, Watchdog};
use crate::error::{LowpError, Result};

/// Bytes of NCCL's unique id (`NCCL_UNIQUE_ID_BYTES`), which the rendezvous carries.
pub const UNIQUE_ID_BYTES: usize = 128;

fn nccl_op(op: ReduceOp) -> sys::ncclRedOp_t {
    match op {
        ReduceOp::Sum => sys::ncclRedOp_t::ncclSum,
        ReduceOp::Max => sys::ncclRedOp_t::ncclMax,
        ReduceOp::Avg => sys::ncclRedOp_t::ncclAvg,
    }
}

/// Element types of a reduction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReduceDtype {
    F32,
    Bf16,
}

impl ReduceDtype {
    pub fn size(self) -> usize {
        match self {
            ReduceDtype::F32 => 4,
            ReduceDtype::Bf16 => 2,
        }
    }

    fn nccl(self) -> sys::ncclDataType_t {
        match self {
            ReduceDtype::F32 => sys::ncclDataType_t::ncclFloat32,
            ReduceDtype::Bf16 => sys::ncclDataType_t::ncclBfloat16,
        }
    }
}

/// Loads NCCL (`libnccl.so`, by name, on first use) and checks its version.
pub fn load() -> Result<NcclVersion> {
    if !unsafe { sys::is_culib_present() } {
        return Err(LowpError::distributed(
            "NCCL was not found: cudarc loads `libnccl.so` (not `libnccl.so.2`) through the dynamic \
             loader; install NCCL's development package (libnccl-dev) or put a `libnccl.so -> \
             libnccl.so.2` link in a directory on LD_LIBRARY_PATH",
        ));
    }
    let mut code = 0;
    check(unsafe { sys::ncclGetVersion(&mut code) }, "ncclGetVersion", None)?;
    let version = NcclVersion::from_code(code)?;
    version.check_supported()?;
    Ok(version)
}

/// A new unique id (rank 0, before the rendezvous hands it to the others).
pub fn new_unique_id() -> Result<Vec<u8>> {
    let mut id = sys::ncclUniqueId { internal: [0; UNIQUE_ID_BYTES] };
    check(unsafe { sys::ncclGetUniqueId(&mut id) }, "ncclGetUniqueId", None)?;
    Ok(id.internal.iter().map(|&c| c as u8).collect())
}

fn unique_id(bytes: &[u8]) -> Result<sys::ncclUniqueId> {
    if bytes.len() != UNIQUE_ID_BYTES {
        return Err(LowpError::invalid(
            "NCCL unique id",
            format!("{} bytes", bytes.len()),
            format!("must be {UNIQUE_ID_BYTES} bytes (rank 0 sent something else)"),
        ));
    }
    let mut id = sys::ncclUniqueId { internal: [0; UNIQUE_ID_BYTES] };
    for (dst, &src) in id.internal.iter_mut().zip(bytes) {
        *dst = src as std::ffi::c_char;
    }
    Ok(id)
}

/// `NCCL_CONFIG_INITIALIZER` with `blocking = 0`: every field NCCL should choose left undefined.
fn nonblocking_config() -> sys::ncclConfig_t {
    const UNDEF: i32 = i32::MIN;
    sys::ncclConfig_t {
        size: std::mem::size_of::<sys::ncclConfig_t>(),
        magic: 0xcafe_beef,
        version: BINDINGS_NCCL.code(),
        blocking: 0,
        cgaClusterSize: UNDEF,
        minCTAs: UNDEF,
        maxCTAs: UNDEF,
        netName: std::ptr::null(),
        splitShare: UNDEF,
        trafficClass: UNDEF,
        commName: std::ptr::null(),
        collnetEnable: UNDEF,
        CTAPolicy: UNDEF,
        shrinkShare: UNDEF,
        nvlsCTAs: UNDEF,
        nChannelsPerNetPeer: UNDEF,
        nvlinkCentricSched: UNDEF,
        graphUsageMode: UNDEF,
        numRmaCtx: UNDEF,
        maxP2pPeers: UNDEF,
    }
}

fn text(ptr: *const std::ffi::c_char) -> String {
    if ptr.is_null() {
        return String::new();
    }
    unsafe { CStr::from_ptr(ptr) }.to_string_lossy().into_owned()
}

fn nccl_error(what: &str, code: Code, comm: Option<sys::ncclComm_t>) -> LowpError {
    let detail = comm
        .map(|c| text(unsafe { sys::ncclGetLastError(c) }))
        .filter(|s| !s.is_empty())
        .map(|s| format!(" ({s})"))
        .unwrap_or_default();
    LowpError::distributed(format!(
        "NCCL {what} failed: {} [{code:?}]{detail}",
        text(unsafe { sys::ncclGetErrorString(code) })
    ))
}

/// `Ok(true)` when done, `Ok(false)` when in progress (non-blocking), else the error.
fn check(code: Code, what: &str, comm: Option<sys::ncclComm_t>) -> Result<bool> {
    match code {
        Code::ncclSuccess => Ok(true),
        Code::ncclInProgress => Ok(false),
        code => Err(nccl_error(what, code, comm)),
    }
}

/// Polls a non-blocking communicator until its last call has finished (for a collective: has
/// been queued on its stream), the deadline passes, or a fault is raised.
fn wait_ready(comm: sys::ncclComm_t, what: &str, deadline: Instant, fault: &FaultState) -> Result<()> {
    let mut pause = Duration::from_micros(20);
    loop {
        let mut state = Code::ncclSuccess;
        check(unsafe { sys::ncclCommGetAsyncError(comm, &mut state) }, "ncclCommGetAsyncError", Some(comm))?;
        if check(state, what, Some(comm))? {
            return Ok(());
        }
        fault.check()?;
        if Instant::now() >= deadline {
            return Err(LowpError::distributed(format!(
                "NCCL {what} did not finish in time: a rank did not join or is stuck"
            )));
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(5));
    }
}

fn driver_error(what: &'static str) -> impl Fn(cudarc::driver::DriverError) -> LowpError {
    move |e| LowpError::distributed(format!("CUDA driver: {what}: {e:?}"))
}

/// What every communicator of a rank shares.
#[derive(Clone)]
pub struct CommResources {
    /// The device's primary context (CubeCL's too).
    pub ctx: Arc<CudaContext>,
    /// How long one NCCL call or collective may take (`LOWP_DIST_TIMEOUT`).
    pub timeout: Duration,
    pub fault: Arc<FaultState>,
    pub watchdog: Arc<Watchdog>,
}

struct RawComm(sys::ncclComm_t);
// SAFETY: NCCL communicators may be used from any thread, one call at a time; the mutex in
// `Shared` serializes them.
unsafe impl Send for RawComm {}

struct Shared {
    name: String,
    rank: usize,
    size: usize,
    /// `None` once aborted or finished.
    comm: Mutex<Option<RawComm>>,
    res: CommResources,
}

impl Shared {
    fn abort(&self) {
        let taken = self.comm.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(RawComm(comm)) = taken {
            // Its own failure changes nothing: the rank is ending with the fault.
            let _ = unsafe { sys::ncclCommAbort(comm) };
        }
    }

    /// The communicator's asynchronous error, if any (a peer's network failure, an aborted
    /// peer); skipped while a call holds the communicator.
    fn async_error(&self) -> Option<String> {
        let guard = self.comm.try_lock().ok()?;
        let comm = guard.as_ref()?.0;
        let mut state = Code::ncclSuccess;
        let code = unsafe { sys::ncclCommGetAsyncError(comm, &mut state) };
        let found = if code != Code::ncclSuccess { code } else { state };
        match found {
            Code::ncclSuccess | Code::ncclInProgress => None,
            e => Some(format!(
                "the NCCL {} communicator reports an asynchronous error: {}",
                self.name,
                nccl_error("communication", e, Some(comm))
            )),
        }
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        self.abort();
    }
}

/// One NCCL communicator: the world, or a group of its ranks. Clones share it.
#[derive(Clone)]
pub struct Communicator {
    shared: Arc<Shared>,
}

impl Communicator {
    /// Joins the communicator of `size` ranks that `id` (rank 0's unique id) names, as `rank`.
    /// Every rank must call this; it returns once all have joined, or fails at the timeout.
    pub fn init(name: &str, id: &[u8], rank: usize, size: usize, res: &CommResources) -> Result<Communicator> {
        let id = unique_id(id)?;
        if rank >= size {
            return Err(LowpError::invalid("NCCL rank", format!("{rank} of {size}"), "must be below the size"));
        }
        res.ctx.bind_to_thread().map_err(driver_error("bind the device's context"))?;
        let mut config = nonblocking_config();
        let mut comm: sys::ncclComm_t = std::ptr::null_mut();
        let code = unsafe { sys::ncclCommInitRankConfig(&mut comm, size as i32, id, rank as i32, &mut config) };
        Communicator::adopt(name, comm, code, "initialisation (ncclCommInitRankConfig)", res)
    }

    /// Waits until a new communicator is ready, then registers it with the fault state (abort on
    /// fault) and the watchdog (its asynchronous errors).
    fn adopt(name: &str, comm: sys::ncclComm_t, code: Code, what: &str, res: &CommResources) -> Result<Communicator> {
        let what = format!("{what} of the {name} communicator");
        let ready = check(code, &what, (!comm.is_null()).then_some(comm)).and_then(|done| {
            if comm.is_null() {
                return Err(LowpError::distributed(format!("NCCL {what} returned no communicator")));
            }
            if done {
                Ok(())
            } else {
                wait_ready(comm, &what, Instant::now() + res.timeout, &res.fault)
            }
        });
        let (mut rank, mut size) = (0, 0);
        let described = ready.and_then(|_| unsafe {
            check(sys::ncclCommUserRank(comm, &mut rank), "ncclCommUserRank", Some(comm))?;
            check(sys::ncclCommCount(comm, &mut size), "ncclCommCount", Some(comm))
        });
        if let Err(e) = described {
            if !comm.is_null() {
                let _ = unsafe { sys::ncclCommAbort(comm) };
            }
            return Err(e);
        }
        let shared = Arc::new(Shared {
            name: name.to_string(),
            rank: rank as usize,
            size: size as usize,
            comm: Mutex::new(Some(RawComm(comm))),
            res: res.clone(),
        });
        let weak: Weak<Shared> = Arc::downgrade(&shared);
        res.fault.on_fault(move |_| {
            if let Some(shared) = weak.upgrade() {
                shared.abort();
            }
        });
        let weak: Weak<Shared> = Arc::downgrade(&shared);
        res.watchdog
            .add_probe(Box::new(move || weak.upgrade().and_then(|s| s.async_error())));
        Ok(Communicator { shared })
    }

    pub fn name(&self) -> &str {
        &self.shared.name
    }

    pub fn rank(&self) -> usize {
        self.shared.rank
    }

    pub fn size(&self) -> usize {
        self.shared.size
    }

    /// Runs `f` with the live communicator, holding it; `Err` after an abort.
    fn with_comm<T>(&self, f: impl FnOnce(sys::ncclComm_t) -> Result<T>) -> Result<T> {
        let guard = self.shared.comm.lock().unwrap_or_else(|p| p.into_inner());
        match guard.as_ref() {
            Some(RawComm(comm)) => f(*comm),
            None => Err(LowpError::distributed(format!(
                "the NCCL {} communicator was aborted{}",
                self.shared.name,
                self.shared.res.fault.message().map(|m| format!(" after: {m}")).unwrap_or_default()
            ))),
        }
    }

    /// After a call that queues work: waits (bounded) if NCCL is still queueing it.
    fn queued(&self, comm: sys::ncclComm_t, code: Code, what: &str) -> Result<()> {
        if !check(code, what, Some(comm))? {
            let res = &self.shared.res;
            wait_ready(comm, what, Instant::now() + res.timeout, &res.fault)?;
        }
        Ok(())
    }

    /// Hands the watchdog an event recorded on `stream` after the collective just queued.
    fn watch(&self, stream: cuda::CUstream, what: String) -> Result<()> {
        let ctx = self.shared.res.ctx.clone();
        let event = ctx
            .new_event(Some(cuda::CUevent_flags::CU_EVENT_DISABLE_TIMING))
            .map_err(driver_error("create an event"))?;
        unsafe { cuda::cuEventRecord(event.cu_event(), stream) }
            .result()
            .map_err(driver_error("record an event after a collective"))?;
        self.shared.res.watchdog.watch(what, Box::new(EventDone { ctx, event }));
        Ok(())
    }

    /// All-reduce of `count` elements from `send` into `recv` (the same pointer: in place).
    ///
    /// # Safety
    /// `send` and `recv` must be device allocations of `count` elements of `dtype` on this
    /// communicator's device that stay alive until `stream` has passed the collective, and
    /// every rank must issue the same collectives in the same order.
    pub unsafe fn all_reduce(
        &self,
        stream: cuda::CUstream,
        send: u64,
        recv: u64,
        count: usize,
        dtype: ReduceDtype,
        op: ReduceOp,
    ) -> Result<()> {
        let what = format!("all-reduce ({op:?}, {count} x {dtype:?}) on the {} communicator", self.name());
        self.with_comm(|comm| {
            let code = unsafe {
                sys::ncclAllReduce(
                    send as *const c_void,
                    recv as *mut c_void,
                    count,
                    dtype.nccl(),
                    nccl_op(op),
                    comm,
                    stream as sys::cudaStream_t,
                )
            };
            self.queued(comm, code, &what)
        })?;
        self.watch(stream, what)
    }

    /// All-gather of `bytes_per_rank` bytes from every rank into `recv` (rank order), e.g. the
    /// token counts per expert before an all-to-all.
    ///
    /// # Safety
    /// As `all_reduce`; `recv` holds `size() * bytes_per_rank` bytes.
    pub unsafe fn all_gather(&self, stream: cuda::CUstream, send: u64, recv: u64, bytes_per_rank: usize) -> Result<()> {
        let what = format!("all-gather ({bytes_per_rank} bytes a rank) on the {} communicator", self.name());
        self.with_comm(|comm| {
            let code = unsafe {
                sys::ncclAllGather(
                    send as *const c_void,
                    recv as *mut c_void,
                    bytes_per_rank,
                    sys::ncclDataType_t::ncclUint8,
                    comm,
                    stream as sys::cudaStream_t,
                )
            };
            self.queued(comm, code, &what)
        })?;
        self.watch(stream, what)
    }

    /// All-to-all with uneven splits, as grouped sends and receives: `send_bytes[p]` bytes from
    /// `send` (blocks in rank order) go to rank `p`, `recv_bytes[p]` bytes from rank `p` land in
    /// `recv` (blocks in rank order). Rank `a`'s `send_bytes[b]` must equal rank `b`'s
    /// `recv_bytes[a]` (`AllToAllSplits` makes them so); empty blocks are skipped.
    ///
    /// # Safety
    /// As `all_reduce`; `send` and `recv` hold the sums of their splits.
    pub unsafe fn all_to_all(
        &self,
        stream: cuda::CUstream,
        send: u64,
        send_bytes: &[usize],
        recv: u64,
        recv_bytes: &[usize],
    ) -> Result<()> {
        let size = self.size();
        if send_bytes.len() != size || recv_bytes.len() != size {
            return Err(LowpError::invalid(
                "all-to-all splits",
                format!("{} send and {} receive", send_bytes.len(), recv_bytes.len()),
                format!("must be one per rank of the {} communicator ({size})", self.name()),
            ));
        }
        let total = |b: &[usize]| b.iter().sum::<usize>();
        let what = format!(
            "all-to-all ({} bytes out, {} in) on the {} communicator",
            total(send_bytes),
            total(recv_bytes),
            self.name()
        );
        self.with_comm(|comm| {
            let mut first_error = check(unsafe { sys::ncclGroupStart() }, "ncclGroupStart", Some(comm)).err();
            let (mut send_at, mut recv_at) = (send, recv);
            for peer in 0..size {
                let peer_i = peer as i32;
                if first_error.is_none() && send_bytes[peer] > 0 {
                    let code = unsafe {
                        sys::ncclSend(
                            send_at as *const c_void,
                            send_bytes[peer],
                            sys::ncclDataType_t::ncclUint8,
                            peer_i,
                            comm,
                            stream as sys::cudaStream_t,
                        )
                    };
                    first_error = check(code, "ncclSend", Some(comm)).err();
                }
                if first_error.is_none() && recv_bytes[peer] > 0 {
                    let code = unsafe {
                        sys::ncclRecv(
                            recv_at as *mut c_void,
                            recv_bytes[peer],
                            sys::ncclDataType_t::ncclUint8,
                            peer_i,
                            comm,
                            stream as sys::cudaStream_t,
                        )
                    };
                    first_error = check(code, "ncclRecv", Some(comm)).err();
                }
                send_at += send_bytes[peer] as u64;
                recv_at += recv_bytes[peer] as u64;
            }
            // The group is closed even after an error, so that NCCL's group state stays balanced.
            let end = unsafe { sys::ncclGroupEnd() };
            match first_error {
                Some(e) => Err(e),
                None => self.queued(comm, end, &what),
            }
        })?;
        self.watch(stream, what)
    }

    /// Ends the communicator after a clean run: flushes it (`ncclCommFinalize`, bounded by the
    /// timeout) and frees it; on failure it is aborted. Other clones then see it aborted.
    pub fn finish(&self) -> Result<()> {
        let taken = self.shared.comm.lock().unwrap_or_else(|p| p.into_inner()).take();
        let Some(RawComm(comm)) = taken else { return Ok(()) };
        let res = &self.shared.res;
        let what = format!("finalize of the {} communicator", self.name());
        let finalized = check(unsafe { sys::ncclCommFinalize(comm) }, &what, Some(comm)).and_then(|done| {
            if done {
                Ok(())
            } else {
                wait_ready(comm, &what, Instant::now() + res.timeout, &res.fault)
            }
        });
        match finalized {
            Ok(()) => {
                check(unsafe { sys::ncclCommDestroy(comm) }, "ncclCommDestroy", None)?;
                Ok(())
            }
            Err(e) => {
                let _ = unsafe { sys::ncclCommAbort(comm) };
                Err(e)
            }
        }
    }

    /// Aborts the communicator now (the fault state does this on any fault).
    pub fn abort(&self) {
        self.shared.abort();
    }
}

/// A CUDA event after a collective, polled by the watchdog's thread.
struct EventDone {
    ctx: Arc<CudaContext>,
    event: CudaEvent,
}

impl Completion for EventDone {
    fn is_complete(&mut self) -> std::result::Result<bool, String> {
        self.ctx.bind_to_thread().map_err(|e| format!("{e:?}"))?;
        match unsafe { cuda::cuEventQuery(self.event.cu_event()) } {
            cuda::CUresult::CUDA_SUCCESS => Ok(true),
            cuda::CUresult::CUDA_ERROR_NOT_READY => Ok(false),
            e => Err(format!("cuEventQuery: {e:?}")),
        }
    }
}
