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
//! (`shared/reference/gemm-interop-measurements.md`).

use std::any::Any;
use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use burn_lowp_kernels::cubecl::cuda::{CudaDevice, CudaRuntime};
use burn_lowp_kernels::cubecl::device::Device;
use burn_lowp_kernels::cubecl::device_handle::DeviceHandle;
use burn_lowp_kernels::cubecl::prelude::*;
use burn_lowp_kernels::cubecl::server::{Binding, Handle};
use burn_lowp_kernels::cubecl::stream_id::StreamId;
use burn_lowp_kernels::stream_flags::{DONE, FLAG_WORDS, READY, TIMED_OUT};
use cudarc::cublaslt::{result as lt, sys as lts};
use cudarc::driver::{sys as cuda, CudaContext, CudaSlice, CudaStream, DevicePtr, PushKernelArg};
use lts::{cublasLtMatmulDescAttributes_t as Attr, cudaDataType_t as DataType};

use super::cube::DeviceTasks;
use super::gemm_profile::{self as profile, GemmPhase};
use super::gemm_tuning;
use super::sm90_grouped::{Sm90GroupedGemm, Sm90Kernels};
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
static ORDERING: AtomicU8 = AtomicU8::new(UNRESOLVED);
const UNRESOLVED: u8 = u8::MAX;

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
/// asks, and reading it takes the environment's lock and allocates).
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
            // A `set_stream_ordering` made meanwhile wins.
            let _ = ORDERING.compare_exchange(UNRESOLVED, ordering.code(), Ordering::Relaxed, Ordering::Relaxed);
            stream_ordering()
        }
    }
}

pub fn set_stream_ordering(ordering: StreamOrdering) {
    ORDERING.store(ordering.code(), Ordering::Relaxed);
}

/// How an operand's scale is applied (cuBLASLt `CUBLASLT_MATMUL_DESC_{A,B}_SCALE_MODE`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ScaleMode {
    /// One f32 for the whole tensor (FP8 per-tensor scaling).
    Tensor,
    /// f32 per 128 elements along K (`VEC128_32F`), laid out `[K/128][outer]`.
    Vec128,
    /// f32 per 128x128 tile (`BLK128x128_32F`), laid out `[outer/128][roundup(K/128, 4)]`.
    Block128x128,
}

/// One GEMM operand as cuBLASLt sees it (column-major).
#[derive(Debug, Clone, Copy)]
pub struct LtOperand {
    pub ptr: u64,
    pub dtype: DataType,
    /// cuBLAS `op(X) = Xᵀ` (the row-major buffer is `[outer, k]`, K contiguous).
    pub transpose: bool,
    /// Leading dimension (elements).
    pub ld: i64,
    /// Dequantization scale (device pointer) for FP8 operands.
    pub scale: Option<(u64, ScaleMode)>,
}

/// A pointer-array batch of GEMMs of the same shape, one per `chunk_rows`-row chunk of a
/// grouped operand B (and of D): entry c multiplies chunk c of B by A's group g (the group whose
/// rows hold the chunk's first row, `group_start`/`group_len` on the device) into chunk c of D.
/// `LtGemm`'s `a`, `b` and `d` pointers are the bases; `pointers` is device memory for the three
/// arrays (`pointer_array_bytes(capacity)`).
///
/// `capacity` is the host-known bound of chunks (D's chunks); the first `count` of them run and
/// D's chunks from `count` on are zeroed (the tail a grouped matrix defines as zero rows, which
/// the skipped entries would have computed from B's zero rows). The plan (descriptor, layouts,
/// algorithm) is the capacity's, whatever `count` a call runs, so every count runs the same
/// algorithm.
#[derive(Debug, Clone, Copy)]
pub struct LtBatch {
    pub count: u64,
    pub capacity: u64,
    pub chunk_rows: u32,
    pub groups: u32,
    pub group_start: u64,
    pub group_len: u64,
    pub a_group_stride: u64,
    pub b_chunk_stride: u64,
    pub d_chunk_stride: u64,
    pub pointers: u64,
}

/// A strided batch of `count` GEMMs of one shape: entry i reads A at `a + i * a` elements (and
/// B, D likewise); attention's per-head products.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LtStrided {
    pub count: u64,
    pub a: i64,
    pub b: i64,
    pub d: i64,
}

/// Bytes of the three pointer arrays of a batch of `count` entries (each 16-byte aligned).
pub fn pointer_array_bytes(count: usize) -> usize {
    3 * count.div_ceil(2) * 16
}

/// `D (m x n, column-major) = op(A) (m x k) · op(B) (k x n) [+ C]`. Row-major, D is `[n, m]`.
#[derive(Debug, Clone, Copy)]
pub struct LtGemm {
    pub m: u64,
    pub n: u64,
    pub k: u64,
    pub a: LtOperand,
    pub b: LtOperand,
    /// Added to the product (beta = 1); same dtype and layout as D.
    pub c: Option<u64>,
    pub d: u64,
    pub d_dtype: DataType,
    /// cuBLASLt's bias epilogue: a vector of `m` elements of D's dtype added to every column of
    /// D (every row of the row-major output) before D is rounded and written.
    pub bias: Option<u64>,
    /// FP8 fast accumulation (TE: fprop with per-tensor scales only; dgrad/wgrad and block
    /// scaling use the split accumulator).
    pub fast_accum: bool,
    /// A pointer-array batch rather than one GEMM.
    pub batch: Option<LtBatch>,
    /// A strided batch rather than one GEMM (not with `batch`).
    pub strided: Option<LtStrided>,
    /// Time cuBLASLt's candidate algorithms on the first GEMM of this shape (one host wait);
    /// off for shapes that change every step (a group's token count), which take the heuristic's
    /// first choice.
    pub autotune: bool,
}

impl LtGemm {
    fn plan_key(&self) -> PlanKey {
        PlanKey {
            m: self.m,
            n: self.n,
            k: self.k,
            a: (
                self.a.dtype,
                self.a.transpose,
                self.a.ld,
                self.a.scale.map(|s| s.1),
            ),
            b: (
                self.b.dtype,
                self.b.transpose,
                self.b.ld,
                self.b.scale.map(|s| s.1),
            ),
            d_dtype: self.d_dtype,
            fast_accum: self.fast_accum,
            has_c: self.c.is_some(),
            has_bias: self.bias.is_some(),
            batch: self.batch.map(|b| b.capacity),
            strided: self.strided,
        }
    }
}

/// One piece of a group's work on our streams: a cuBLASLt GEMM (or batch), or a launch of our
/// Hopper grouped GEMM (`sm90_grouped`), which runs where cuBLASLt would (lane 0 for a group of
/// one), under the same stream ordering.
#[derive(Debug, Clone, Copy)]
pub enum GroupWork {
    Lt(LtGemm),
    Sm90(Sm90GroupedGemm),
}

impl From<LtGemm> for GroupWork {
    fn from(g: LtGemm) -> Self {
        GroupWork::Lt(g)
    }
}

/// What fixes a GEMM's cuBLASLt descriptor, layouts and algorithm: everything but the pointers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct PlanKey {
    m: u64,
    n: u64,
    k: u64,
    /// dtype, transpose, leading dimension, scale mode.
    a: (DataType, bool, i64, Option<ScaleMode>),
    b: (DataType, bool, i64, Option<ScaleMode>),
    d_dtype: DataType,
    fast_accum: bool,
    has_c: bool,
    has_bias: bool,
    batch: Option<u64>,
    strided: Option<LtStrided>,
}

/// A GEMM shape's matmul descriptor, layouts and chosen algorithm, made on its first call and kept
/// (building them cost microseconds of host time per call); each call only sets its scale pointers.
struct Plan {
    desc: lts::cublasLtMatmulDesc_t,
    a: lts::cublasLtMatrixLayout_t,
    b: lts::cublasLtMatrixLayout_t,
    d: lts::cublasLtMatrixLayout_t,
    algo: lts::cublasLtMatmulAlgo_t,
    /// A pointer-array plan's batch count its layouts hold now (see `LtBatch`).
    batch_count: Option<u64>,
}

impl Plan {
    /// Sets the layouts' batch count to `count` entries (a cheap host-side attribute).
    unsafe fn run_entries(&mut self, count: u64) -> Result<()> {
        if self.batch_count != Some(count) {
            for layout in [self.a, self.b, self.d] {
                unsafe { set_batch_count(layout, count as i32)? };
            }
            self.batch_count = Some(count);
        }
        Ok(())
    }

    /// Destroys what was created (on a failed build).
    unsafe fn destroy(desc: lts::cublasLtMatmulDesc_t, layouts: &[lts::cublasLtMatrixLayout_t]) {
        unsafe {
            let _ = lt::destroy_matmul_desc(desc);
            for &layout in layouts {
                let _ = lt::destroy_matrix_layout(layout);
            }
        }
    }
}

/// Plans kept before GEMMs of shapes that are not autotuned stop being cached (see `enqueue_on`).
const MAX_UNTUNED_PLANS: usize = 4096;

/// Streams a group of GEMMs spreads over (TE uses 4 for its per-expert GEMMs).
const LANES: usize = 4;

/// The device flags one CubeCL stream uses to order itself against ours.
struct StreamFlags {
    handle: Handle,
    ptr: u64,
    /// The last value signalled; the next GEMM uses `counter + 1`.
    counter: u32,
    /// Keeps the flag memory pinned (a CubeCL `ManagedResource`).
    _pin: Box<dyn Any + Send>,
}

impl StreamFlags {
    /// A new flag buffer, zeroed on the device before this returns: our stream's wait kernel
    /// reads it outside CubeCL's stream order, so it must never see the pool memory's old bytes
    /// (a stale large READY would let a GEMM start before its producers). One host
    /// synchronization per CubeCL stream.
    fn zeroed(client: &ComputeClient<CudaRuntime>) -> Result<Self> {
        let handle = client.create_from_slice(&[0u8; FLAG_WORDS * 4]);
        let pin = client
            .get_resource(handle.clone())
            .map_err(|e| LowpError::invalid("CubeCL", "get_resource", format!("{e:?}")))?;
        burn_lowp_kernels::cubecl::future::block_on(client.sync())
            .map_err(|e| LowpError::invalid("CubeCL", "sync", format!("{e:?}")))?;
        super::host_sync::record_stream_setup();
        Ok(StreamFlags {
            handle,
            ptr: pin.resource().ptr,
            counter: 0,
            _pin: Box::new(pin),
        })
    }
}

/// The per-device cuBLASLt state: handle, stream, workspace, chosen algorithms, stream flags.
pub struct CublasLt {
    ctx: Arc<CudaContext>,
    /// Lane 0 is our main stream (the handshake's); lanes 1.. are forks for groups of GEMMs.
    lanes: Vec<Lane>,
    handle: lts::cublasLtHandle_t,
    workspace_size: usize,
    /// The SMs a GEMM planned under `DeviceFlags` may use: all but the one CubeCL's wait kernel
    /// holds.
    sm_target: i32,
    /// Recorded on CubeCL's stream before a `CubeclStream` group (our main stream waits for it)
    /// and on our main stream after it (CubeCL's stream waits): a wait takes the event as last
    /// recorded when the wait is queued, so two events serve every group.
    fork: cudarc::driver::CudaEvent,
    join: cudarc::driver::CudaEvent,
    plans: HashMap<PlanKey, Plan>,
    flags: HashMap<u64, StreamFlags>,
    /// Our stream's kernels (NVRTC), compiled on first use.
    kernels: Option<OurKernels>,
    /// Our Hopper grouped GEMM's kernels (NVRTC, `sm90_grouped`), compiled on first use; a
    /// failed compilation is kept (as its message) and reported by every later use.
    sm90: Option<std::result::Result<Sm90Kernels, String>>,
    /// The GPU's name and the cuBLASLt version, which begin this device's keys in the tuning
    /// table (`gemm_tuning`).
    tuning_prefix: String,
}

/// A stream of ours and the cuBLASLt workspace of the GEMMs it runs.
struct Lane {
    stream: Arc<CudaStream>,
    workspace: CudaSlice<u8>,
}

struct OurKernels {
    wait_ready: cudarc::driver::CudaFunction,
    fill_pointers: cudarc::driver::CudaFunction,
}

// SAFETY: the handle and the pinned resources are only used behind the global mutex.
unsafe impl Send for CublasLt {}

fn lt_error(what: &str) -> impl Fn(lt::CublasError) -> LowpError + '_ {
    move |e| LowpError::invalid("cuBLASLt", what, format!("{e:?}"))
}

fn driver_error(what: &str) -> impl Fn(cudarc::driver::DriverError) -> LowpError + '_ {
    move |e| LowpError::invalid("CUDA driver", what, format!("{e:?}"))
}

unsafe fn set<T>(desc: lts::cublasLtMatmulDesc_t, attr: Attr, value: &T) -> Result<()> {
    unsafe {
        lt::set_matmul_desc_attribute(
            desc,
            attr,
            value as *const T as *const c_void,
            std::mem::size_of::<T>(),
        )
    }
    .map_err(lt_error("set matmul attribute"))
}

/// Points the descriptor at this call's dequantization scales and bias (the per-call attributes
/// of a cached `Plan`).
unsafe fn set_call_pointers(desc: lts::cublasLtMatmulDesc_t, g: &LtGemm) -> Result<()> {
    for (scale, pointer) in [
        (g.a.scale, Attr::CUBLASLT_MATMUL_DESC_A_SCALE_POINTER),
        (g.b.scale, Attr::CUBLASLT_MATMUL_DESC_B_SCALE_POINTER),
    ] {
        if let Some((ptr, _)) = scale {
            unsafe { set(desc, pointer, &ptr)? };
        }
    }
    if let Some(bias) = g.bias {
        unsafe { set(desc, Attr::CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias)? };
    }
    Ok(())
}

fn scale_mode_value(mode: ScaleMode) -> i32 {
    use lts::cublasLtMatmulMatrixScale_t as S;
    (match mode {
        ScaleMode::Tensor => S::CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F,
        ScaleMode::Vec128 => S::CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F,
        ScaleMode::Block128x128 => S::CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F,
    }) as i32
}

/// Reads of DONE before CubeCL's wait kernel gives up (an atomic read takes 0.1-1 µs, so
/// several seconds; one GEMM takes milliseconds).
const CUBECL_MAX_POLLS: u32 = 1 << 25;

static INSTANCES: OnceLock<Mutex<HashMap<usize, CublasLt>>> = OnceLock::new();

impl CublasLt {
    fn new(device: usize) -> Result<Self> {
        use cudarc::driver::sys::CUdevice_attribute as A;
        let ctx = CudaContext::new(device).map_err(driver_error("open device"))?;
        let handle = lt::create_handle().map_err(lt_error("create handle"))?;
        let workspace_size = 32 << 20;
        let sms = ctx
            .attribute(A::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
            .map_err(driver_error("multiprocessor count"))?;
        let tuning_prefix = format!(
            "{} cublasLt {}",
            ctx.name().map_err(driver_error("device name"))?,
            unsafe { lts::cublasLtGetVersion() }
        );
        let no_timing = Some(cuda::CUevent_flags::CU_EVENT_DISABLE_TIMING);
        let fork = ctx.new_event(no_timing).map_err(driver_error("event"))?;
        let join = ctx.new_event(no_timing).map_err(driver_error("event"))?;
        let mut instance = CublasLt {
            fork,
            join,
            ctx,
            lanes: Vec::new(),
            handle,
            workspace_size,
            sm_target: (sms - 1).max(1),
            plans: HashMap::new(),
            flags: HashMap::new(),
            kernels: None,
            sm90: None,
            tuning_prefix,
        };
        instance.add_lane()?;
        Ok(instance)
    }

    fn add_lane(&mut self) -> Result<()> {
        let stream = self.ctx.new_stream().map_err(driver_error("create stream"))?;
        let workspace = unsafe { stream.alloc::<u8>(self.workspace_size) }
            .map_err(driver_error("workspace"))?;
        self.lanes.push(Lane { stream, workspace });
        Ok(())
    }

    fn main_stream(&self) -> &Arc<CudaStream> {
        &self.lanes[0].stream
    }

    /// Runs `f` with the process-wide instance of CUDA device `device`, creating it on first use.
    pub fn with<T>(device: usize, f: impl FnOnce(&mut CublasLt) -> Result<T>) -> Result<T> {
        let cell = INSTANCES.get_or_init(|| Mutex::new(HashMap::new()));
        let mut guard = cell
            .lock()
            .map_err(|_| LowpError::invalid("cuBLASLt", "lock", "poisoned by an earlier panic"))?;
        if !guard.contains_key(&device) {
            let instance = CublasLt::new(device)?;
            guard.insert(device, instance);
        }
        f(guard.get_mut(&device).expect("inserted above"))
    }

    /// Enqueues one GEMM on our main stream (does not wait).
    ///
    /// # Safety
    /// Every pointer in `g` must be a live device allocation of the size the dimensions imply.
    pub unsafe fn enqueue(&mut self, g: &LtGemm) -> Result<()> {
        unsafe { self.enqueue_on(0, g) }
    }

    /// Enqueues one GEMM (or pointer-array batch) on lane `lane`.
    unsafe fn enqueue_on(&mut self, lane: usize, g: &LtGemm) -> Result<()> {
        self.ctx
            .bind_to_thread()
            .map_err(driver_error("bind context"))?;
        if let Some(batch) = &g.batch {
            self.fill_pointers(lane, g, batch)?;
            if batch.count == 0 {
                return self.zero_tail(lane, g.d, batch);
            }
        }
        let key = g.plan_key();
        let mut plan = match self.plans.remove(&key) {
            Some(plan) => plan,
            None => unsafe { self.new_plan(lane, g)? },
        };
        let mut result = unsafe { self.run_plan(lane, &mut plan, g) };
        if let (Ok(()), Some(batch)) = (&result, &g.batch) {
            if batch.count < batch.capacity {
                // After the run: a new plan's timing runs computed every entry.
                result = self.zero_tail(lane, g.d, batch);
            }
        }
        // Shapes that change every step (a group's token count, not autotuned) stop being kept
        // once many are: their plans would otherwise grow without bound over a training run.
        if g.autotune || self.plans.len() < MAX_UNTUNED_PLANS {
            self.plans.insert(key, plan);
        } else {
            unsafe { Plan::destroy(plan.desc, &[plan.a, plan.b, plan.d]) };
        }
        result
    }

    /// Runs `g` on its plan (with this call's scale pointers); a batch runs its `count` entries
    /// (see `LtBatch`).
    unsafe fn run_plan(&mut self, lane: usize, plan: &mut Plan, g: &LtGemm) -> Result<()> {
        unsafe { set_call_pointers(plan.desc, g)? };
        if let Some(batch) = &g.batch {
            unsafe { plan.run_entries(batch.count)? };
        }
        unsafe { self.matmul(lane, plan.desc, g, &plan.algo, plan.a, plan.b, plan.d) }
    }

    /// Zeroes D's chunks from `batch.count` to `batch.capacity` on lane `lane`.
    fn zero_tail(&mut self, lane: usize, d: u64, batch: &LtBatch) -> Result<()> {
        let stream = &self.lanes[lane].stream;
        let start = d + batch.count * batch.d_chunk_stride;
        let words = (batch.capacity - batch.count) * batch.d_chunk_stride / 4;
        unsafe { cuda::cuMemsetD32Async(start, 0, words as usize, stream.cu_stream()) }
            .result()
            .map_err(driver_error("zero the batch's tail"))
    }

    /// The descriptor, layouts and algorithm of `g`'s shape (see `Plan`).
    unsafe fn new_plan(&mut self, lane: usize, g: &LtGemm) -> Result<Plan> {
        let desc = lt::create_matmul_desc(
            lts::cublasComputeType_t::CUBLAS_COMPUTE_32F,
            DataType::CUDA_R_32F,
        )
        .map_err(lt_error("create matmul desc"))?;
        if let Err(e) = unsafe { self.describe(desc, g) } {
            unsafe { Plan::destroy(desc, &[]) };
            return Err(e);
        }
        // Layouts are (rows, cols) of the stored column-major matrix.
        let (a_rows, a_cols) = if g.a.transpose {
            (g.k, g.m)
        } else {
            (g.m, g.k)
        };
        let (b_rows, b_cols) = if g.b.transpose {
            (g.n, g.k)
        } else {
            (g.k, g.n)
        };
        let mut layouts = Vec::with_capacity(3);
        let strides = match g.strided {
            Some(s) => [Some(s.a), Some(s.b), Some(s.d)],
            None => [None; 3],
        };
        let made = [
            (g.a.dtype, a_rows, a_cols, g.a.ld, strides[0], "layout A"),
            (g.b.dtype, b_rows, b_cols, g.b.ld, strides[1], "layout B"),
            (g.d_dtype, g.m, g.n, g.m as i64, strides[2], "layout D"),
        ]
        .into_iter()
        .try_for_each(|(dtype, rows, cols, ld, stride, what)| {
            let layout = lt::create_matrix_layout(dtype, rows, cols, ld).map_err(lt_error(what))?;
            layouts.push(layout);
            match (&g.batch, g.strided, stride) {
                (Some(batch), _, _) => unsafe { set_batched(layout, batch.capacity as i32) },
                (None, Some(strided), Some(stride)) => unsafe {
                    set_strided(layout, strided.count as i32, stride)
                },
                _ => Ok(()),
            }
        });
        let (a, b, d) = match (made, layouts.as_slice()) {
            (Ok(()), &[a, b, d]) => (a, b, d),
            (result, _) => {
                unsafe { Plan::destroy(desc, &layouts) };
                return Err(result.err().unwrap_or_else(|| {
                    LowpError::invalid("cuBLASLt", "layouts", "three matrix layouts")
                }));
            }
        };
        match unsafe { self.choose_algo(lane, desc, g, a, b, d) } {
            Ok(algo) => Ok(Plan {
                desc,
                a,
                b,
                d,
                algo,
                batch_count: g.batch.map(|b| b.capacity),
            }),
            Err(e) => {
                unsafe { Plan::destroy(desc, &layouts) };
                Err(e)
            }
        }
    }

    /// The descriptor attributes fixed by the GEMM's shape and formats (not its pointers).
    unsafe fn describe(&self, desc: lts::cublasLtMatmulDesc_t, g: &LtGemm) -> Result<()> {
        unsafe {
            if stream_ordering() == StreamOrdering::DeviceFlags {
                set(desc, Attr::CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET, &self.sm_target)?;
            }
            set(
                desc,
                Attr::CUBLASLT_MATMUL_DESC_TRANSA,
                &(g.a.transpose as i32),
            )?;
            set(
                desc,
                Attr::CUBLASLT_MATMUL_DESC_TRANSB,
                &(g.b.transpose as i32),
            )?;
            for (scale, mode) in [
                (g.a.scale, Attr::CUBLASLT_MATMUL_DESC_A_SCALE_MODE),
                (g.b.scale, Attr::CUBLASLT_MATMUL_DESC_B_SCALE_MODE),
            ] {
                if let Some((_, scale_mode)) = scale {
                    if scale_mode != ScaleMode::Tensor {
                        set(desc, mode, &scale_mode_value(scale_mode))?;
                    }
                }
            }
            // (FP8 on unit scales, e.g. a pointer array whose per-group scales are applied
            // after it, asks for fast accumulation too.)
            if g.a.scale.is_some() || g.fast_accum {
                set(
                    desc,
                    Attr::CUBLASLT_MATMUL_DESC_FAST_ACCUM,
                    &(g.fast_accum as i8),
                )?;
            }
            if g.bias.is_some() {
                let epilogue = lts::cublasLtEpilogue_t::CUBLASLT_EPILOGUE_BIAS as u32;
                set(desc, Attr::CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue)?;
                set(desc, Attr::CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &(g.d_dtype as i32))?;
            }
            // The heuristic and the timing runs read the scale and bias pointers too.
            set_call_pointers(desc, g)
        }
    }

    /// The algorithm for a new GEMM shape: the tuning table's (`gemm_tuning`: a loaded file or
    /// an earlier timing) if it holds one that cuBLASLt accepts for this GEMM; else cuBLASLt's
    /// heuristic proposes up to `CANDIDATES`, each is timed on this very GEMM (a warm-up run each,
    /// then `TIMED_RUNS` rounds of one run of every candidate between two events; its best run
    /// counts), and the fastest is kept and recorded in the table. Every
    /// run writes the same D (`A·B`, or `A·B + C` from another buffer), so the result is the same
    /// whichever ran last. One host wait per timed shape. `LOWP_GEMM_AUTOTUNE=0` keeps the
    /// heuristic's first choice (what TE does); `LOWP_GEMM_AUTOTUNE_LOG=1` prints each choice
    /// (with the candidates' times) to stderr.
    unsafe fn choose_algo(
        &mut self,
        lane: usize,
        desc: lts::cublasLtMatmulDesc_t,
        g: &LtGemm,
        a: lts::cublasLtMatrixLayout_t,
        b: lts::cublasLtMatrixLayout_t,
        d: lts::cublasLtMatrixLayout_t,
    ) -> Result<lts::cublasLtMatmulAlgo_t> {
        const CANDIDATES: usize = 8;
        const TIMED_RUNS: usize = 3;
        let timed = g.autotune && std::env::var("LOWP_GEMM_AUTOTUNE").as_deref() != Ok("0");
        let log = std::env::var_os("LOWP_GEMM_AUTOTUNE_LOG").is_some();
        let key = format!("{} {:?}", self.tuning_prefix, g.plan_key());
        if let Some(data) = gemm_tuning::tuned(&key).filter(|_| timed) {
            let algo = lts::cublasLtMatmulAlgo_t { data };
            if unsafe { self.accepts(desc, a, b, d, &algo) } {
                if log {
                    eprintln!("lowp-autotune {:?} -> the tuning table's", g.plan_key());
                }
                return Ok(algo);
            }
        }
        let pref = lt::create_matmul_pref().map_err(lt_error("create preference"))?;
        let bytes = self.workspace_size as u64;
        let mut results: [lts::cublasLtMatmulHeuristicResult_t; CANDIDATES] =
            unsafe { std::mem::zeroed() };
        let mut count: std::ffi::c_int = 0;
        let status = unsafe {
            lt::set_matmul_pref_attribute(
                pref,
                lts::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                &bytes as *const u64 as *const c_void,
                8,
            )
            .map_err(lt_error("set preference"))
            .and_then(|_| {
                lts::cublasLtMatmulAlgoGetHeuristic(
                    self.handle,
                    desc,
                    a,
                    b,
                    d,
                    d,
                    pref,
                    CANDIDATES as std::ffi::c_int,
                    results.as_mut_ptr(),
                    &mut count,
                )
                .result()
                .map_err(lt_error("algorithm heuristic"))
            })
        };
        let _ = unsafe { lt::destroy_matmul_pref(pref) };
        status?;
        let candidates: Vec<_> = results[..count.max(0) as usize]
            .iter()
            .filter(|r| r.state == lts::cublasStatus_t::CUBLAS_STATUS_SUCCESS)
            .map(|r| r.algo)
            .collect();
        let Some(&first) = candidates.first() else {
            return Err(LowpError::invalid(
                "cuBLASLt",
                "no cuBLASLt algorithm for this GEMM",
                format!("{g:?}"),
            ));
        };
        if candidates.len() == 1 || !timed {
            return Ok(first);
        }
        super::host_sync::record_gemm_autotune();
        let timing = Some(cuda::CUevent_flags::CU_EVENT_DEFAULT);
        let stream = self.lanes[lane].stream.clone();
        // A warm-up run of each candidate, then rounds of one timed run of every candidate: a
        // GPU at its power limit slows down within a second of back-to-back GEMMs, so timing
        // the candidates one after the other favoured the first ones (an H100's clock goes
        // from 1980 to 1380-1500 MHz; `benches/results/turns-h100/`). Each keeps its best run.
        let candidates: Vec<_> = candidates
            .into_iter()
            .filter(|algo| unsafe { self.matmul(lane, desc, g, algo, a, b, d) }.is_ok())
            .collect();
        let mut events = Vec::new();
        for _ in 0..TIMED_RUNS {
            for (index, algo) in candidates.iter().enumerate() {
                let start = stream.record_event(timing).map_err(driver_error("event"))?;
                let ran = unsafe { self.matmul(lane, desc, g, algo, a, b, d) }.is_ok();
                let end = stream.record_event(timing).map_err(driver_error("event"))?;
                events.push((index, ran, start, end));
            }
        }
        let mut times = vec![f32::INFINITY; candidates.len()];
        for (index, ran, start, end) in events {
            let ms = start.elapsed_ms(&end).map_err(driver_error("event time"))?;
            if ran {
                times[index] = times[index].min(ms);
            }
        }
        let mut best = (f32::INFINITY, first, 0usize);
        for (index, (&ms, algo)) in times.iter().zip(&candidates).enumerate() {
            if ms < best.0 {
                best = (ms, *algo, index);
            }
        }
        if log {
            eprintln!("lowp-autotune {:?} -> candidate {} ms {:?}", g.plan_key(), best.2, times);
        }
        gemm_tuning::record_tuned(key, best.1.data);
        Ok(best.1)
    }

    /// Whether cuBLASLt can run `algo` for this GEMM within our workspace (an algorithm from a
    /// tuning file is checked before use).
    unsafe fn accepts(
        &self,
        desc: lts::cublasLtMatmulDesc_t,
        a: lts::cublasLtMatrixLayout_t,
        b: lts::cublasLtMatrixLayout_t,
        d: lts::cublasLtMatrixLayout_t,
        algo: &lts::cublasLtMatmulAlgo_t,
    ) -> bool {
        let mut result: lts::cublasLtMatmulHeuristicResult_t = unsafe { std::mem::zeroed() };
        let status =
            unsafe { lts::cublasLtMatmulAlgoCheck(self.handle, desc, a, b, d, d, algo, &mut result) };
        status == lts::cublasStatus_t::CUBLAS_STATUS_SUCCESS
            && result.state == lts::cublasStatus_t::CUBLAS_STATUS_SUCCESS
            && result.workspaceSize <= self.workspace_size
    }

    unsafe fn matmul(
        &mut self,
        lane: usize,
        desc: lts::cublasLtMatmulDesc_t,
        g: &LtGemm,
        algo: &lts::cublasLtMatmulAlgo_t,
        a: lts::cublasLtMatrixLayout_t,
        b: lts::cublasLtMatrixLayout_t,
        d: lts::cublasLtMatrixLayout_t,
    ) -> Result<()> {
        let alpha = 1.0f32;
        let beta = if g.c.is_some() { 1.0f32 } else { 0.0f32 };
        // A batch passes its pointer arrays (written by `fill_pointers`) instead of the matrices.
        let (a_ptr, b_ptr, d_ptr) = match &g.batch {
            Some(batch) => {
                let stride = batch.capacity.div_ceil(2) * 16;
                (batch.pointers, batch.pointers + stride, batch.pointers + 2 * stride)
            }
            None => (g.a.ptr, g.b.ptr, g.d),
        };
        let c = if g.batch.is_some() { d_ptr } else { g.c.unwrap_or(g.d) };
        let lane = &self.lanes[lane];
        let (workspace, guard) = lane.workspace.device_ptr(&lane.stream);
        let result = unsafe {
            lt::matmul(
                self.handle,
                desc,
                &alpha as *const f32 as *const c_void,
                &beta as *const f32 as *const c_void,
                a_ptr as *const c_void,
                a,
                b_ptr as *const c_void,
                b,
                c as *const c_void,
                d,
                d_ptr as *mut c_void,
                d,
                algo,
                workspace as *mut c_void,
                self.workspace_size,
                lane.stream.cu_stream() as lts::cudaStream_t,
            )
        };
        drop(guard);
        result.map_err(lt_error("matmul"))
    }

    pub fn synchronize(&self) -> Result<()> {
        for lane in &self.lanes {
            lane.stream
                .synchronize()
                .map_err(driver_error("stream sync"))?;
        }
        Ok(())
    }

    fn our_kernels(&mut self) -> Result<&OurKernels> {
        if self.kernels.is_none() {
            self.kernels = Some(compile_our_kernels(&self.ctx)?);
        }
        Ok(self.kernels.as_ref().expect("compiled above"))
    }

    /// Writes a batch's pointer arrays on lane `lane` (see `LtBatch`).
    fn fill_pointers(&mut self, lane: usize, g: &LtGemm, batch: &LtBatch) -> Result<()> {
        let function = self.our_kernels()?.fill_pointers.clone();
        let stream = self.lanes[lane].stream.clone();
        // Every entry of the capacity (the plan's algorithm was chosen on all of them).
        let count = batch.capacity as u32;
        let stride_words = (batch.capacity.div_ceil(2) * 2) as u32;
        let mut launch = stream.launch_builder(&function);
        launch
            .arg(&batch.pointers)
            .arg(&count)
            .arg(&stride_words)
            .arg(&batch.group_start)
            .arg(&batch.group_len)
            .arg(&batch.groups)
            .arg(&batch.chunk_rows)
            .arg(&g.a.ptr)
            .arg(&batch.a_group_stride)
            .arg(&g.b.ptr)
            .arg(&batch.b_chunk_stride)
            .arg(&g.d)
            .arg(&batch.d_chunk_stride);
        unsafe {
            launch.launch(cudarc::driver::LaunchConfig {
                grid_dim: (count.div_ceil(128).max(1), 1, 1),
                block_dim: (128, 1, 1),
                shared_mem_bytes: 0,
            })
        }
        .map(|_| ())
        .map_err(driver_error("launch pointer kernel"))
    }

    /// Our Hopper grouped GEMM's kernels, compiled on first use (`sm90_grouped`).
    fn sm90_kernels(&mut self) -> Result<&Sm90Kernels> {
        if self.sm90.is_none() {
            self.ctx.bind_to_thread().map_err(driver_error("bind context"))?;
            self.sm90 = Some(Sm90Kernels::compile(&self.ctx).map_err(|e| e.to_string()));
        }
        match self.sm90.as_ref().expect("compiled above") {
            Ok(kernels) => Ok(kernels),
            Err(message) => Err(LowpError::invalid(
                "sm90 grouped GEMM",
                "its kernels",
                format!("could not be compiled or loaded: {message}"),
            )),
        }
    }

    /// Queues our Hopper grouped GEMM on lane `lane` (where a cuBLASLt GEMM of the group would
    /// run): a persistent grid of one CTA per SM, less the SM CubeCL's wait kernel holds under
    /// `DeviceFlags` (as cuBLASLt's `sm_target`).
    unsafe fn enqueue_sm90(&mut self, lane: usize, g: &Sm90GroupedGemm) -> Result<()> {
        self.ctx.bind_to_thread().map_err(driver_error("bind context"))?;
        let stream = self.lanes[lane].stream.cu_stream();
        let sm_target = self.sm_target as u32;
        let flags = stream_ordering() == StreamOrdering::DeviceFlags;
        let multiprocessors = super::cuda_gemm::multiprocessors(self.ctx.ordinal()) as u32;
        let kernels = self.sm90_kernels()?;
        let ctas = if flags { sm_target.min(multiprocessors) } else { multiprocessors };
        unsafe { kernels.launch(g, stream, ctas) }
    }

    /// Queues one piece of a group's work on lane `lane`.
    unsafe fn enqueue_work_on(&mut self, lane: usize, work: &GroupWork) -> Result<()> {
        match work {
            GroupWork::Lt(g) => unsafe { self.enqueue_on(lane, g) },
            GroupWork::Sm90(g) => unsafe { self.enqueue_sm90(lane, g) },
        }
    }

    /// Runs `gemms` spread over the lanes (added up to `LANES` on first use): every lane starts
    /// after what the main stream queued so far, and the main stream continues after all of them.
    unsafe fn enqueue_group(&mut self, gemms: &[GroupWork]) -> Result<()> {
        if gemms.len() <= 1 {
            return gemms
                .first()
                .map_or(Ok(()), |g| unsafe { self.enqueue_work_on(0, g) });
        }
        while self.lanes.len() < LANES.min(gemms.len()) {
            self.add_lane()?;
        }
        let used = LANES.min(gemms.len());
        let start = self
            .main_stream()
            .record_event(None)
            .map_err(driver_error("event"))?;
        for lane in 1..used {
            self.lanes[lane]
                .stream
                .wait(&start)
                .map_err(driver_error("stream wait"))?;
        }
        for (i, g) in gemms.iter().enumerate() {
            unsafe { self.enqueue_work_on(i % used, g)? };
        }
        for lane in 1..used {
            let done = self.lanes[lane]
                .stream
                .record_event(None)
                .map_err(driver_error("event"))?;
            self.main_stream()
                .wait(&done)
                .map_err(driver_error("stream wait"))?;
        }
        Ok(())
    }

    /// Orders our main stream after what `stream` (CubeCL's) has queued so far.
    fn fork_from(&mut self, stream: cuda::CUstream) -> Result<()> {
        self.ctx.bind_to_thread().map_err(driver_error("bind context"))?;
        unsafe {
            cuda::cuEventRecord(self.fork.cu_event(), stream)
                .result()
                .map_err(driver_error("record event on CubeCL's stream"))?;
            cuda::cuStreamWaitEvent(self.main_stream().cu_stream(), self.fork.cu_event(), 0)
                .result()
                .map_err(driver_error("wait for CubeCL's stream"))
        }
    }

    /// Orders what `stream` (CubeCL's) queues next after what our main stream has queued.
    fn join_into(&mut self, stream: cuda::CUstream) -> Result<()> {
        unsafe {
            cuda::cuEventRecord(self.join.cu_event(), self.main_stream().cu_stream())
                .result()
                .map_err(driver_error("record event on our stream"))?;
            cuda::cuStreamWaitEvent(stream, self.join.cu_event(), 0)
                .result()
                .map_err(driver_error("CubeCL's stream waits for ours"))
        }
    }

    /// The flags of the calling thread's CubeCL stream on `client`, created on first use.
    fn stream_flags(&mut self, client: &ComputeClient<CudaRuntime>) -> Result<&mut StreamFlags> {
        let stream = StreamId::current().value;
        if !self.flags.contains_key(&stream) {
            let flags = StreamFlags::zeroed(client)?;
            self.flags.insert(stream, flags);
        }
        Ok(self.flags.get_mut(&stream).expect("inserted above"))
    }

    /// The flag buffer of the caller's CubeCL stream and the value the next GEMM signals with.
    fn next_flag_value(
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
    fn wait_ready(&mut self, flags: u64, value: u32) -> Result<()> {
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
    fn signal_done(&self, flags: u64, value: u32) -> Result<()> {
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

/// Polls of READY before our stream's wait kernel gives up: with a 128 ns sleep between polls,
/// about ten seconds, far longer than CubeCL's queue ahead of a GEMM can take.
const OUR_MAX_POLLS: u32 = 1 << 26;

/// Our streams' kernels, compiled with NVRTC on first use:
/// * `lowp_wait_ready`: CubeCL's pool memory (`cuMemAllocAsync`) is refused by
///   `cuStreamWaitValue32` (CUDA_ERROR_INVALID_VALUE, seen on an H100 with driver 580), so our
///   stream polls the flag with a kernel instead;
/// * `lowp_fill_pointers`: a pointer-array batch's arrays from the groups' device offsets (entry c
///   takes A's group holding row `c * chunk_rows`; tail chunks the last group starting at or
///   before it, whose zero rows make zero output).
fn compile_our_kernels(ctx: &Arc<CudaContext>) -> Result<OurKernels> {
    let source = format!(
        r#"
extern "C" __global__ void lowp_fill_pointers(
    unsigned long long* arrays, unsigned int count, unsigned int stride,
    const unsigned int* group_start, const unsigned int* group_len, unsigned int groups,
    unsigned int chunk_rows,
    unsigned long long a, unsigned long long a_stride,
    unsigned long long b, unsigned long long b_stride,
    unsigned long long d, unsigned long long d_stride) {{
    unsigned int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= count) return;
    unsigned long long row = (unsigned long long)c * chunk_rows;
    unsigned int lo = 0, hi = groups;
    while (hi - lo > 1) {{
        unsigned int mid = (lo + hi) / 2;
        if (group_start[mid] <= row) lo = mid; else hi = mid;
    }}
    (void)group_len;
    arrays[c] = a + lo * a_stride;
    arrays[stride + c] = b + c * b_stride;
    arrays[2 * stride + c] = d + c * d_stride;
}}

extern "C" __global__ void lowp_wait_ready(unsigned int* flags, unsigned int value, unsigned int max_polls) {{
    volatile unsigned int* ready = flags + {READY};
    unsigned int polls = 0;
    while (*ready < value) {{
        if (++polls >= max_polls) {{
            ((volatile unsigned int*)flags)[{TIMED_OUT}] = value;
            return;
        }}
        __nanosleep(128);
    }}
    __threadfence();
}}
"#
    );
    let ptx = cudarc::nvrtc::compile_ptx_with_opts(
        source,
        cudarc::nvrtc::CompileOptions {
            arch: Some("compute_75"),
            ..Default::default()
        },
    )
    .map_err(|e| LowpError::invalid("NVRTC", "our kernels", format!("{e:?}")))?;
    let module = ctx
        .load_module(ptx)
        .map_err(driver_error("load our kernels"))?;
    Ok(OurKernels {
        wait_ready: module
            .load_function("lowp_wait_ready")
            .map_err(driver_error("wait kernel function"))?,
        fill_pointers: module
            .load_function("lowp_fill_pointers")
            .map_err(driver_error("pointer kernel function"))?,
    })
}

/// Marks a matrix layout as a pointer-array batch of `count` entries.
unsafe fn set_batched(layout: lts::cublasLtMatrixLayout_t, count: i32) -> Result<()> {
    use lts::cublasLtMatrixLayoutAttribute_t as L;
    let mode = lts::cublasLtBatchMode_t::CUBLASLT_BATCH_MODE_POINTER_ARRAY as i32;
    for (attr, value) in [
        (L::CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, count),
        (L::CUBLASLT_MATRIX_LAYOUT_BATCH_MODE, mode),
    ] {
        unsafe {
            lt::set_matrix_layout_attribute(
                layout,
                attr,
                &value as *const i32 as *const c_void,
                std::mem::size_of::<i32>(),
            )
        }
        .map_err(lt_error("set layout attribute"))?;
    }
    Ok(())
}

/// Sets a pointer-array layout's batch count.
unsafe fn set_batch_count(layout: lts::cublasLtMatrixLayout_t, count: i32) -> Result<()> {
    unsafe {
        lt::set_matrix_layout_attribute(
            layout,
            lts::cublasLtMatrixLayoutAttribute_t::CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT,
            &count as *const i32 as *const c_void,
            std::mem::size_of::<i32>(),
        )
    }
    .map_err(lt_error("set layout batch count"))
}

/// Marks a matrix layout as a strided batch of `count` matrices `stride` elements apart.
unsafe fn set_strided(layout: lts::cublasLtMatrixLayout_t, count: i32, stride: i64) -> Result<()> {
    use lts::cublasLtMatrixLayoutAttribute_t as L;
    unsafe {
        lt::set_matrix_layout_attribute(
            layout,
            L::CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT,
            &count as *const i32 as *const c_void,
            std::mem::size_of::<i32>(),
        )
        .map_err(lt_error("set layout batch count"))?;
        lt::set_matrix_layout_attribute(
            layout,
            L::CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
            &stride as *const i64 as *const c_void,
            std::mem::size_of::<i64>(),
        )
        .map_err(lt_error("set layout batch stride"))
    }
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
type CudaServer = <CudaRuntime as Runtime>::Server;
fn cubecl_server(device: usize) -> DeviceHandle<CudaServer> {
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
            "panicked on CubeCL's device thread",
        )),
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
    let (stream, pointers) = server
        .stream_for_external_work(StreamId::current(), bindings)
        .map_err(|e| LowpError::invalid("CubeCL", "operand buffers", format!("{e:?}")))?;
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
