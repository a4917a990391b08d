//! The per-device cuBLASLt state (`CublasLt`: handle, our streams and their workspaces, cached
//! plans, stream flags, our kernels) and how it queues work on our streams: one GEMM, a pointer
//! array's pointers, our Hopper grouped GEMM, or a group spread over several streams.

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::cublaslt::{result as lt, sys as lts};
use cudarc::driver::{sys as cuda, CudaContext, CudaSlice, CudaStream, DevicePtr, PushKernelArg};

use super::kernels::{compile_our_kernels, OurKernels};
use super::ordering::{stream_ordering, StreamFlags, StreamOrdering};
use super::plan::{set_call_pointers, GroupWork, LtBatch, LtGemm, Plan, PlanKey};
use crate::backend::cuda::sm90_grouped::{Sm90GroupedGemm, Sm90Kernels};
use crate::error::{LowpError, Result};

/// The per-device cuBLASLt state: handle, stream, workspace, chosen algorithms, stream flags.
pub struct CublasLt {
    pub(super) ctx: Arc<CudaContext>,
    /// Lane 0 is our main stream (the handshake's); lanes 1.. are forks for groups of GEMMs.
    pub(super) lanes: Vec<Lane>,
    pub(super) handle: lts::cublasLtHandle_t,
    pub(super) workspace_size: usize,
    /// The SMs a GEMM planned under `DeviceFlags` may use: all but the one CubeCL's wait kernel
    /// holds.
    pub(super) sm_target: i32,
    /// Recorded on CubeCL's stream before a `CubeclStream` group (our main stream waits for it)
    /// and on our main stream after it (CubeCL's stream waits): a wait takes the event as last
    /// recorded when the wait is queued, so two events serve every group.
    pub(super) fork: cudarc::driver::CudaEvent,
    pub(super) join: cudarc::driver::CudaEvent,
    pub(super) plans: HashMap<PlanKey, Plan>,
    pub(super) flags: HashMap<u64, StreamFlags>,
    /// Our stream's kernels (NVRTC), compiled on first use.
    pub(super) kernels: Option<OurKernels>,
    /// Our Hopper grouped GEMM's kernels (NVRTC, `sm90_grouped`), compiled on first use; a
    /// failed compilation is kept (as its message) and reported by every later use.
    sm90: Option<std::result::Result<Sm90Kernels, String>>,
    /// The GPU's name and the cuBLASLt version, which begin this device's keys in the tuning
    /// table (`gemm_tuning`).
    pub(super) tuning_prefix: String,
}

/// A stream of ours and the cuBLASLt workspace of the GEMMs it runs.
pub(super) struct Lane {
    pub(super) stream: Arc<CudaStream>,
    pub(super) workspace: CudaSlice<u8>,
}

// SAFETY: the handle and the pinned resources are only used behind the global mutex.
unsafe impl Send for CublasLt {}

pub(super) fn lt_error(what: &str) -> impl Fn(lt::CublasError) -> LowpError + '_ {
    move |e| LowpError::invalid("cuBLASLt", what, format!("{e:?}"))
}

pub(super) fn driver_error(what: &str) -> impl Fn(cudarc::driver::DriverError) -> LowpError + '_ {
    move |e| LowpError::invalid("CUDA driver", what, format!("{e:?}"))
}

/// Plans kept before GEMMs of shapes that are not autotuned stop being cached (see `enqueue_on`).
pub(super) const MAX_UNTUNED_PLANS: usize = 4096;

/// Streams a group of GEMMs spreads over (TE uses 4 for its per-expert GEMMs).
pub(super) const LANES: usize = 4;

pub(super) static INSTANCES: OnceLock<Mutex<HashMap<usize, CublasLt>>> = OnceLock::new();

impl CublasLt {
    pub(super) fn new(device: usize) -> Result<Self> {
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

    pub(super) fn add_lane(&mut self) -> Result<()> {
        let stream = self.ctx.new_stream().map_err(driver_error("create stream"))?;
        let workspace = unsafe { stream.alloc::<u8>(self.workspace_size) }
            .map_err(driver_error("workspace"))?;
        self.lanes.push(Lane { stream, workspace });
        Ok(())
    }

    pub(super) fn main_stream(&self) -> &Arc<CudaStream> {
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
    pub(super) unsafe fn enqueue_on(&mut self, lane: usize, g: &LtGemm) -> Result<()> {
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
    pub(super) unsafe fn run_plan(&mut self, lane: usize, plan: &mut Plan, g: &LtGemm) -> Result<()> {
        unsafe { set_call_pointers(plan.desc, g)? };
        if let Some(batch) = &g.batch {
            unsafe { plan.run_entries(batch.count)? };
        }
        unsafe { self.matmul(lane, plan.desc, g, &plan.algo, plan.a, plan.b, plan.d) }
    }

    /// Zeroes D's chunks from `batch.count` to `batch.capacity` on lane `lane`.
    pub(super) fn zero_tail(&mut self, lane: usize, d: u64, batch: &LtBatch) -> Result<()> {
        let stream = &self.lanes[lane].stream;
        let start = d + batch.count * batch.d_chunk_stride;
        let words = (batch.capacity - batch.count) * batch.d_chunk_stride / 4;
        unsafe { cuda::cuMemsetD32Async(start, 0, words as usize, stream.cu_stream()) }
            .result()
            .map_err(driver_error("zero the batch's tail"))
    }

    pub(super) unsafe fn matmul(
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

    pub(super) fn our_kernels(&mut self) -> Result<&OurKernels> {
        if self.kernels.is_none() {
            self.kernels = Some(compile_our_kernels(&self.ctx)?);
        }
        Ok(self.kernels.as_ref().expect("compiled above"))
    }

    /// Writes a batch's pointer arrays on lane `lane` (see `LtBatch`).
    pub(super) fn fill_pointers(&mut self, lane: usize, g: &LtGemm, batch: &LtBatch) -> Result<()> {
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
    pub(super) fn sm90_kernels(&mut self) -> Result<&Sm90Kernels> {
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
    pub(super) unsafe fn enqueue_sm90(&mut self, lane: usize, g: &Sm90GroupedGemm) -> Result<()> {
        self.ctx.bind_to_thread().map_err(driver_error("bind context"))?;
        let stream = self.lanes[lane].stream.cu_stream();
        let sm_target = self.sm_target as u32;
        let flags = stream_ordering() == StreamOrdering::DeviceFlags;
        let multiprocessors = crate::backend::cuda::device::multiprocessors(self.ctx.ordinal()) as u32;
        let kernels = self.sm90_kernels()?;
        let ctas = if flags { sm_target.min(multiprocessors) } else { multiprocessors };
        unsafe { kernels.launch(g, stream, ctas) }
    }

    /// Queues one piece of a group's work on lane `lane`.
    pub(super) unsafe fn enqueue_work_on(&mut self, lane: usize, work: &GroupWork) -> Result<()> {
        match work {
            GroupWork::Lt(g) => unsafe { self.enqueue_on(lane, g) },
            GroupWork::Sm90(g) => unsafe { self.enqueue_sm90(lane, g) },
        }
    }

    /// Runs `gemms` spread over the lanes (added up to `LANES` on first use): every lane starts
    /// after what the main stream queued so far, and the main stream continues after all of them.
    pub(super) unsafe fn enqueue_group(&mut self, gemms: &[GroupWork]) -> Result<()> {
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
}
