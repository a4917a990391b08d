//! cuBLASLt GEMMs on CUDA, on the device buffers CubeCL owns. Stream interop lives here and
//! nowhere else.
//!
//! CubeCL 0.10 does not expose its CUDA stream, so cuBLASLt runs on a stream of ours, and the two
//! are ordered one of two ways (`StreamOrdering`):
//! * `DeviceFlags` (default, no host synchronization): a one-thread CubeCL kernel writes a
//!   counter value to a device flag after the GEMM's producers; a one-thread kernel on our stream
//!   (NVRTC) waits for it, the GEMM runs, `cuMemsetD32Async` writes the value to a second flag,
//!   and a one-thread CubeCL kernel holds CubeCL's stream until it sees it. (The driver's
//!   `cuStreamWaitValue32` would avoid the first kernel, but it refuses CubeCL's pool memory.)
//!   Everything CubeCL queues afterwards (the consumers, and any reuse of the inputs' memory)
//!   runs after the GEMM. This assumes the GEMM's operands live on the calling thread's CubeCL
//!   stream, which is how Burn runs a training step.
//! * `HostSync` (fallback): pin the operands, `client.sync()`, run the GEMM, synchronize our
//!   stream. Two host round trips per GEMM; `benches/gemm.rs` measures what they cost.
//! Both contexts are the device's primary context, so pointers are shared.

use std::any::Any;
use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use burn_lowp_kernels::cubecl::cuda::CudaRuntime;
use burn_lowp_kernels::cubecl::prelude::*;
use burn_lowp_kernels::cubecl::server::Handle;
use burn_lowp_kernels::cubecl::stream_id::StreamId;
use burn_lowp_kernels::stream_flags::{DONE, FLAG_WORDS, READY, TIMED_OUT};
use cudarc::cublaslt::{result as lt, sys as lts};
use cudarc::driver::{sys as cuda, CudaContext, CudaSlice, CudaStream, DevicePtr, PushKernelArg};
use lts::{cublasLtMatmulDescAttributes_t as Attr, cudaDataType_t as DataType};

use crate::error::{LowpError, Result};

/// How a cuBLASLt GEMM is ordered against CubeCL's stream (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamOrdering {
    DeviceFlags,
    HostSync,
}

static ORDERING: AtomicU8 = AtomicU8::new(u8::MAX);

/// The ordering in use: set by `set_stream_ordering`, else `LOWP_STREAM_ORDERING=host-sync`, else
/// `DeviceFlags`.
pub fn stream_ordering() -> StreamOrdering {
    match ORDERING.load(Ordering::Relaxed) {
        0 => StreamOrdering::DeviceFlags,
        1 => StreamOrdering::HostSync,
        _ => match std::env::var("LOWP_STREAM_ORDERING").as_deref() {
            Ok("host-sync") => StreamOrdering::HostSync,
            _ => StreamOrdering::DeviceFlags,
        },
    }
}

pub fn set_stream_ordering(ordering: StreamOrdering) {
    ORDERING.store(
        match ordering {
            StreamOrdering::DeviceFlags => 0,
            StreamOrdering::HostSync => 1,
        },
        Ordering::Relaxed,
    );
}

/// How an operand's scale is applied (cuBLASLt `CUBLASLT_MATMUL_DESC_{A,B}_SCALE_MODE`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
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
    /// FP8 fast accumulation (TE: fprop with per-tensor scales only; dgrad/wgrad and block
    /// scaling use the split accumulator).
    pub fast_accum: bool,
}

impl LtGemm {
    fn algo_key(&self) -> String {
        format!(
            "{} {} {} {:?} {:?} {} {} {} {} {:?} {:?} {:?} {} {}",
            self.m,
            self.n,
            self.k,
            self.a.dtype,
            self.b.dtype,
            self.a.transpose,
            self.b.transpose,
            self.a.ld,
            self.b.ld,
            self.a.scale.map(|s| s.1),
            self.b.scale.map(|s| s.1),
            self.d_dtype,
            self.fast_accum,
            self.c.is_some()
        )
    }
}

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
    stream: Arc<CudaStream>,
    handle: lts::cublasLtHandle_t,
    workspace: CudaSlice<u8>,
    workspace_size: usize,
    algos: HashMap<String, lts::cublasLtMatmulAlgo_t>,
    flags: HashMap<u64, StreamFlags>,
    /// Our stream's wait kernel (NVRTC), compiled on first use.
    wait_ready_fn: Option<cudarc::driver::CudaFunction>,
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
        let ctx = CudaContext::new(device).map_err(driver_error("open device"))?;
        let stream = ctx.new_stream().map_err(driver_error("create stream"))?;
        let handle = lt::create_handle().map_err(lt_error("create handle"))?;
        let workspace_size = 32 << 20;
        let workspace =
            unsafe { stream.alloc::<u8>(workspace_size) }.map_err(driver_error("workspace"))?;
        Ok(CublasLt {
            ctx,
            stream,
            handle,
            workspace,
            workspace_size,
            algos: HashMap::new(),
            flags: HashMap::new(),
            wait_ready_fn: None,
        })
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

    /// Enqueues one GEMM on our stream (does not wait).
    ///
    /// # Safety
    /// Every pointer in `g` must be a live device allocation of the size the dimensions imply.
    pub unsafe fn enqueue(&mut self, g: &LtGemm) -> Result<()> {
        self.ctx
            .bind_to_thread()
            .map_err(driver_error("bind context"))?;
        let desc = lt::create_matmul_desc(
            lts::cublasComputeType_t::CUBLAS_COMPUTE_32F,
            DataType::CUDA_R_32F,
        )
        .map_err(lt_error("create matmul desc"))?;
        let result = unsafe { self.enqueue_with(desc, g) };
        let _ = unsafe { lt::destroy_matmul_desc(desc) };
        result
    }

    unsafe fn enqueue_with(&mut self, desc: lts::cublasLtMatmulDesc_t, g: &LtGemm) -> Result<()> {
        unsafe {
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
            for (scale, pointer, mode) in [
                (
                    g.a.scale,
                    Attr::CUBLASLT_MATMUL_DESC_A_SCALE_POINTER,
                    Attr::CUBLASLT_MATMUL_DESC_A_SCALE_MODE,
                ),
                (
                    g.b.scale,
                    Attr::CUBLASLT_MATMUL_DESC_B_SCALE_POINTER,
                    Attr::CUBLASLT_MATMUL_DESC_B_SCALE_MODE,
                ),
            ] {
                if let Some((ptr, scale_mode)) = scale {
                    set(desc, pointer, &ptr)?;
                    if scale_mode != ScaleMode::Tensor {
                        set(desc, mode, &scale_mode_value(scale_mode))?;
                    }
                }
            }
            if g.a.scale.is_some() {
                set(
                    desc,
                    Attr::CUBLASLT_MATMUL_DESC_FAST_ACCUM,
                    &(g.fast_accum as i8),
                )?;
            }
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
        let a = lt::create_matrix_layout(g.a.dtype, a_rows, a_cols, g.a.ld)
            .map_err(lt_error("layout A"))?;
        let b = lt::create_matrix_layout(g.b.dtype, b_rows, b_cols, g.b.ld)
            .map_err(lt_error("layout B"))?;
        let d = lt::create_matrix_layout(g.d_dtype, g.m, g.n, g.m as i64)
            .map_err(lt_error("layout D"))?;
        let result = unsafe { self.run(desc, g, a, b, d) };
        unsafe {
            let _ = lt::destroy_matrix_layout(a);
            let _ = lt::destroy_matrix_layout(b);
            let _ = lt::destroy_matrix_layout(d);
        }
        result
    }

    unsafe fn run(
        &mut self,
        desc: lts::cublasLtMatmulDesc_t,
        g: &LtGemm,
        a: lts::cublasLtMatrixLayout_t,
        b: lts::cublasLtMatrixLayout_t,
        d: lts::cublasLtMatrixLayout_t,
    ) -> Result<()> {
        let key = g.algo_key();
        let algo = match self.algos.get(&key) {
            Some(algo) => *algo,
            None => {
                let algo = unsafe { self.choose_algo(desc, g, a, b, d)? };
                self.algos.insert(key, algo);
                algo
            }
        };
        unsafe { self.matmul(desc, g, &algo, a, b, d) }
    }

    /// The algorithm for a new GEMM shape: cuBLASLt's heuristic proposes up to `CANDIDATES`;
    /// each is timed on this very GEMM (a warm-up run, then `TIMED_RUNS` between two events) and
    /// the fastest is kept. Every run writes the same D (`A·B`, or `A·B + C` from another buffer),
    /// so the result is the same whichever ran last. One host wait per new shape.
    /// `LOWP_GEMM_AUTOTUNE=0` keeps the heuristic's first choice (what TE does).
    unsafe fn choose_algo(
        &mut self,
        desc: lts::cublasLtMatmulDesc_t,
        g: &LtGemm,
        a: lts::cublasLtMatrixLayout_t,
        b: lts::cublasLtMatrixLayout_t,
        d: lts::cublasLtMatrixLayout_t,
    ) -> Result<lts::cublasLtMatmulAlgo_t> {
        const CANDIDATES: usize = 8;
        const TIMED_RUNS: usize = 3;
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
        if candidates.len() == 1 || std::env::var("LOWP_GEMM_AUTOTUNE").as_deref() == Ok("0") {
            return Ok(first);
        }
        let timing = Some(cuda::CUevent_flags::CU_EVENT_DEFAULT);
        let mut best = (f32::INFINITY, first);
        for algo in candidates {
            if unsafe { self.matmul(desc, g, &algo, a, b, d) }.is_err() {
                continue;
            }
            let start = self
                .stream
                .record_event(timing)
                .map_err(driver_error("event"))?;
            let ran =
                (0..TIMED_RUNS).all(|_| unsafe { self.matmul(desc, g, &algo, a, b, d) }.is_ok());
            let end = self
                .stream
                .record_event(timing)
                .map_err(driver_error("event"))?;
            let ms = start.elapsed_ms(&end).map_err(driver_error("event time"))?;
            if ran && ms < best.0 {
                best = (ms, algo);
            }
        }
        Ok(best.1)
    }

    unsafe fn matmul(
        &mut self,
        desc: lts::cublasLtMatmulDesc_t,
        g: &LtGemm,
        algo: &lts::cublasLtMatmulAlgo_t,
        a: lts::cublasLtMatrixLayout_t,
        b: lts::cublasLtMatrixLayout_t,
        d: lts::cublasLtMatrixLayout_t,
    ) -> Result<()> {
        let alpha = 1.0f32;
        let beta = if g.c.is_some() { 1.0f32 } else { 0.0f32 };
        let c = g.c.unwrap_or(g.d);
        let (workspace, guard) = self.workspace.device_ptr(&self.stream);
        let result = unsafe {
            lt::matmul(
                self.handle,
                desc,
                &alpha as *const f32 as *const c_void,
                &beta as *const f32 as *const c_void,
                g.a.ptr as *const c_void,
                a,
                g.b.ptr as *const c_void,
                b,
                c as *const c_void,
                d,
                g.d as *mut c_void,
                d,
                algo,
                workspace as *mut c_void,
                self.workspace_size,
                self.stream.cu_stream() as lts::cudaStream_t,
            )
        };
        drop(guard);
        result.map_err(lt_error("matmul"))
    }

    pub fn synchronize(&self) -> Result<()> {
        self.stream
            .synchronize()
            .map_err(driver_error("stream sync"))
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
        let stream = self.stream.clone();
        let flags = self.stream_flags(client)?;
        if flags.counter == u32::MAX {
            // Values must only grow: after 2^32 GEMMs, drain both streams and start over with a
            // fresh zeroed buffer.
            burn_lowp_kernels::cubecl::future::block_on(client.sync())
                .map_err(|e| LowpError::invalid("CubeCL", "sync", format!("{e:?}")))?;
            stream.synchronize().map_err(driver_error("stream sync"))?;
            *flags = StreamFlags::zeroed(client)?;
        }
        flags.counter += 1;
        Ok((flags.handle.clone(), flags.ptr, flags.counter))
    }

    /// Queues on our stream a one-thread kernel that returns once READY of the flags at `flags`
    /// reaches `value` (or records `value` in TIMED_OUT after `OUR_MAX_POLLS` polls).
    fn wait_ready(&mut self, flags: u64, value: u32) -> Result<()> {
        if self.wait_ready_fn.is_none() {
            self.wait_ready_fn = Some(compile_wait_ready(&self.ctx)?);
        }
        let function = self.wait_ready_fn.as_ref().expect("compiled above");
        let max_polls = OUR_MAX_POLLS;
        let mut launch = self.stream.launch_builder(function);
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
            cuda::cuMemsetD32Async(flags + (DONE * 4) as u64, value, 1, self.stream.cu_stream())
        }
        .result()
        .map_err(driver_error("cuMemsetD32Async"))
    }
}

/// Polls of READY before our stream's wait kernel gives up: with a 128 ns sleep between polls,
/// about ten seconds, far longer than CubeCL's queue ahead of a GEMM can take.
const OUR_MAX_POLLS: u32 = 1 << 26;

/// The wait kernel of our stream, compiled with NVRTC on first use. CubeCL's pool memory
/// (`cuMemAllocAsync`) is refused by `cuStreamWaitValue32` (CUDA_ERROR_INVALID_VALUE, seen on an
/// H100 with driver 580), so our stream polls the flag with a kernel instead.
fn compile_wait_ready(ctx: &Arc<CudaContext>) -> Result<cudarc::driver::CudaFunction> {
    let source = format!(
        r#"
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
    .map_err(|e| LowpError::invalid("NVRTC", "wait kernel", format!("{e:?}")))?;
    let module = ctx
        .load_module(ptx)
        .map_err(driver_error("load wait kernel"))?;
    module
        .load_function("lowp_wait_ready")
        .map_err(driver_error("wait kernel function"))
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
    if let Some(p) = pointers.iter().find(|p| *p % 16 != 0) {
        return Err(LowpError::invalid(
            "GEMM operand",
            format!("address {p:#x}"),
            "cuBLASLt needs 16-byte aligned buffers",
        ));
    }
    Ok((pins, pointers))
}

fn host_synchronized(
    client: &ComputeClient<CudaRuntime>,
    lt: &mut CublasLt,
    gemm: &LtGemm,
) -> Result<()> {
    burn_lowp_kernels::cubecl::future::block_on(client.sync())
        .map_err(|e| LowpError::invalid("CubeCL", "sync", format!("{e:?}")))?;
    unsafe { lt.enqueue(gemm)? };
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

/// Runs a GEMM on CubeCL buffers. `buffers` are every buffer the GEMM reads or writes; `build`
/// turns their device pointers (same order) into the GEMM.
///
/// Everything runs as one task on CubeCL's device thread (`client.exclusive`), where CubeCL's
/// own calls (launching the flag kernels, pinning each buffer) execute inline instead of each
/// being a blocking round trip through its channel. It also means the cuBLASLt state lock is
/// only ever taken on device threads, never by a thread that then waits for one.
pub fn run_on_cubecl_buffers(
    client: &ComputeClient<CudaRuntime>,
    device: usize,
    buffers: &[&Handle],
    build: impl FnOnce(&[u64]) -> LtGemm + Send,
) -> Result<()> {
    client
        .exclusive(|| run_on_device_thread(client, device, buffers, build))
        .map_err(|e| LowpError::invalid("CubeCL", "device thread", format!("{e:?}")))?
}

fn run_on_device_thread(
    client: &ComputeClient<CudaRuntime>,
    device: usize,
    buffers: &[&Handle],
    build: impl FnOnce(&[u64]) -> LtGemm,
) -> Result<()> {
    CublasLt::with(device, |lt| match stream_ordering() {
        StreamOrdering::HostSync => {
            let (pins, pointers) = pin_buffers(client, buffers)?;
            let result = host_synchronized(client, lt, &build(&pointers));
            drop(pins);
            result
        }
        StreamOrdering::DeviceFlags => {
            let (flags, flags_ptr, value) = lt.next_flag_value(client)?;
            // Queued behind the producers. CubeCL batches launches in a channel to its device
            // thread; the blocking `get_resource` calls below flush it, so the signal kernel is
            // on the CUDA stream before our stream starts waiting for it.
            burn_lowp_kernels::signal_flag(client, &flags, value);
            let (pins, pointers) = pin_buffers(client, buffers)?;
            let gemm = build(&pointers);
            if let Err(e) = lt.wait_ready(flags_ptr, value) {
                eprintln!("burn-lowp: {e}; falling back to host-synchronized cuBLASLt ordering");
                set_stream_ordering(StreamOrdering::HostSync);
                let result = host_synchronized(client, lt, &gemm);
                drop(pins);
                return result;
            }
            let result = unsafe { lt.enqueue(&gemm) };
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
            result
        }
    })
}
