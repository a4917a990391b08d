//! Our Hopper grouped GEMM (`sm90/grouped_gemm.cu`) for the graph-safe grouped fprop/dgrad, an
//! alternative to cuBLASLt's pointer-array batch where that batch would run the host-known bound
//! of chunks (`cuda_grouped`: the splits' host copy has not arrived when the GEMM is queued). One
//! persistent launch reads the experts' aligned row offsets on the device and computes only the
//! chunks the splits fill, so the bound costs nothing; the output rows past them (the grouped
//! matrix's zero tail) are zeroed by the kernel's idle producer warps while it computes.
//!
//! The eight kernels the crate launches are compiled by NVRTC (arch `sm_90a`) once per CUDA
//! context, on first use, and kept in the device's cuBLASLt state (`cublaslt::CublasLt`), which
//! launches them on the stream its GEMMs use (`cublaslt::GroupWork::Sm90`), so every
//! `StreamOrdering` orders them as it orders cuBLASLt.
//!
//! Which kernel runs the bound is a process-wide setting, [`GroupedKernel`]:
//! [`set_grouped_kernel`], else the environment variable `LOWP_GROUPED_KERNEL` (`cublaslt` or
//! `sm90`, read once per process; another value is reported on stderr and ignored), else
//! `GroupedKernel::Sm90`, which falls back to cuBLASLt's bound batch wherever our kernel does not
//! apply (below). On the H100 (stop 48, MEASUREMENTS.md, in turns with PyTorch) our kernel runs
//! issue 9's shapes at 1.02-1.29 of `torch._grouped_mm` in BF16 and 1.04-1.35 of
//! `torch._scaled_grouped_mm` in FP8 with per-expert scales (2.8-2.9x with the split accumulator
//! at 128 experts), where the bound batch ran 0.86-1.27 in BF16 and 0.66-0.97 in FP8 with its
//! scale pass (earlier stops' turns). In the `GroupedLinear` step (8 experts, 2048 -> 2048) it
//! measured 0.3-1.7 % faster than the bound batch in BF16 and, with the hybrid dgrad on it too,
//! from 1.1 % faster (balanced splits) to 0.8 % slower (skewed) in FP8 current scaling.
//!
//! Under `Sm90` our kernel runs where [`is_sm90`] holds (compute capability exactly 9.0), the
//! output is BF16, both operands are BF16 (fprop: B = the weights `[E, N, K]`, K-major; dgrad: B =
//! the same weights read MN-major) or both FP8 E4M3 per-tensor (fprop with the rowwise weights,
//! dgrad with their columnwise per-expert transpose, both K-major; the split accumulator where the
//! GEMM asks for it) or, the hybrid recipes' dgrad, E5M2 gradient rows with those E4M3 weights (the
//! same kernels, wgmma reading A as E5M2), rows are multiples of 16 bytes and the buffers 16-byte
//! aligned; anything else keeps cuBLASLt's bound batch. BF16 runs the cooperative kernels (128 x
//! 256 tiles) at every reduction length: since their epilogue goes through shared memory they beat
//! the pingpong ones (128 x 128 tiles, one consumer warpgroup storing while the other computes) by
//! 12 % at K = 768. FP8 with fast accumulation runs the pingpong kernel where the reduction takes
//! at most 16 stages of 128 bytes (K <= 2048), 2-6 % ahead on the dgrad there, and the cooperative
//! one above (`benches/sm90_probe`, MEASUREMENTS.md).
//!
//! Launch (as `benches/sm90_probe/harness.cu`, verified on an H100): grid = the SMs (one fewer
//! under `DeviceFlags`, whose wait kernel holds one), 384 threads, dynamic shared memory
//! `stages * (128 + BN) * 128 + 2 * 16384 + 1024 + stages * 16 + 16` bytes, arguments three
//! `CUtensorMap`s (A `[P, K]`, B `[E, N, K]` or `[E, K, N]`, D `[P, ldd]` for the epilogue's TMA
//! stores; 128-byte swizzle) and [`GroupedGemmArgs`] by value.

use std::ffi::c_void;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Once};

use cudarc::cublaslt::sys::cudaDataType_t as DataType;
use cudarc::driver::{sys as cuda, CudaContext, CudaFunction};

use crate::error::{LowpError, Result};

/// Which kernel runs a graph-safe grouped fprop/dgrad whose splits the host does not know yet
/// (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GroupedKernel {
    /// cuBLASLt's pointer-array batch over the host-known bound of chunks.
    CublasLt,
    /// The default: our Hopper kernel (`sm90/grouped_gemm.cu`) where it supports the GEMM, else
    /// cuBLASLt's batch.
    Sm90,
}

impl GroupedKernel {
    fn code(self) -> u8 {
        match self {
            GroupedKernel::CublasLt => 0,
            GroupedKernel::Sm90 => 1,
        }
    }
}

/// The setting's code (`GroupedKernel::code`); `UNRESOLVED` until the first call to
/// `grouped_kernel` or `set_grouped_kernel`.
static KERNEL: AtomicU8 = AtomicU8::new(UNRESOLVED);
const UNRESOLVED: u8 = u8::MAX;

/// The setting in use: set by [`set_grouped_kernel`], else `LOWP_GROUPED_KERNEL=cublaslt|sm90`,
/// else `Sm90`. The variable is read once per process.
pub fn grouped_kernel() -> GroupedKernel {
    match KERNEL.load(Ordering::Relaxed) {
        0 => GroupedKernel::CublasLt,
        1 => GroupedKernel::Sm90,
        _ => {
            let kernel = match std::env::var("LOWP_GROUPED_KERNEL") {
                Ok(v) if v == "cublaslt" => GroupedKernel::CublasLt,
                Ok(v) if v == "sm90" => GroupedKernel::Sm90,
                Ok(other) => {
                    static REPORTED: Once = Once::new();
                    REPORTED.call_once(|| {
                        eprintln!(
                            "burn-lowp: LOWP_GROUPED_KERNEL={other:?} is neither `cublaslt` nor \
                             `sm90`; using `sm90`"
                        )
                    });
                    GroupedKernel::Sm90
                }
                Err(_) => GroupedKernel::Sm90,
            };
            // A `set_grouped_kernel` made meanwhile wins.
            let _ = KERNEL.compare_exchange(UNRESOLVED, kernel.code(), Ordering::Relaxed, Ordering::Relaxed);
            grouped_kernel()
        }
    }
}

pub fn set_grouped_kernel(kernel: GroupedKernel) {
    KERNEL.store(kernel.code(), Ordering::Relaxed);
}

/// Whether CUDA device `device` has compute capability exactly 9.0 (H100, H200, GH200), the
/// kernels' `sm_90a` target (the attributes read once per device, `device::device_attribute`).
pub fn is_sm90(device: usize) -> bool {
    use cuda::CUdevice_attribute as A;
    super::device::is_hopper(device)
        && super::device::device_attribute(device, A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR) == 0
}

/// One of the eight kernels of `sm90/grouped_gemm.cu` the crate launches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Sm90Variant {
    /// BF16, B `[E, N, K]` (K-major): fprop. Cooperative, BN 256, 4 stages.
    Bf16Tn,
    /// BF16, B `[E, K, N]` (MN-major): dgrad with the weights as stored. Cooperative, BN 256.
    Bf16Nn,
    /// FP8 E4M3, B K-major, fast accumulation. Cooperative, BN 256, 4 stages.
    E4m3Tn,
    /// FP8 E4M3, B K-major, split accumulator. Cooperative, BN 128, 6 stages.
    E4m3TnSplit,
    /// `E4m3Tn` as pingpong, BN 128, 6 stages.
    E4m3TnPingpong,
    /// `E4m3Tn`, `E4m3TnSplit` and `E4m3TnPingpong` with E5M2 rows (A: the hybrid recipes'
    /// gradient) and E4M3 weights (B).
    E5m2Tn,
    E5m2TnSplit,
    E5m2TnPingpong,
}

impl Sm90Variant {
    const ALL: [Sm90Variant; 8] = [
        Sm90Variant::Bf16Tn,
        Sm90Variant::Bf16Nn,
        Sm90Variant::E4m3Tn,
        Sm90Variant::E4m3TnSplit,
        Sm90Variant::E4m3TnPingpong,
        Sm90Variant::E5m2Tn,
        Sm90Variant::E5m2TnSplit,
        Sm90Variant::E5m2TnPingpong,
    ];

    fn index(self) -> usize {
        self as usize
    }

    /// The kernel's symbol in the module.
    pub fn name(self) -> &'static str {
        match self {
            Sm90Variant::Bf16Tn => "lowp_grouped_gemm_bf16_tn_256",
            Sm90Variant::Bf16Nn => "lowp_grouped_gemm_bf16_nn_256",
            Sm90Variant::E4m3Tn => "lowp_grouped_gemm_e4m3_tn_256",
            Sm90Variant::E4m3TnSplit => "lowp_grouped_gemm_e4m3_tn_split_128",
            Sm90Variant::E4m3TnPingpong => "lowp_grouped_gemm_e4m3_tn_128_pingpong",
            Sm90Variant::E5m2Tn => "lowp_grouped_gemm_e5m2_tn_256",
            Sm90Variant::E5m2TnSplit => "lowp_grouped_gemm_e5m2_tn_split_128",
            Sm90Variant::E5m2TnPingpong => "lowp_grouped_gemm_e5m2_tn_128_pingpong",
        }
    }

    /// Output columns per tile.
    pub fn bn(self) -> u32 {
        match self {
            Sm90Variant::Bf16Tn | Sm90Variant::Bf16Nn | Sm90Variant::E4m3Tn | Sm90Variant::E5m2Tn => 256,
            _ => 128,
        }
    }

    fn stages(self) -> u32 {
        if self.bn() == 256 {
            4
        } else {
            6
        }
    }

    fn fp8(self) -> bool {
        !matches!(self, Sm90Variant::Bf16Tn | Sm90Variant::Bf16Nn)
    }

    fn mn_major(self) -> bool {
        matches!(self, Sm90Variant::Bf16Nn)
    }

    /// Operand element bytes.
    fn element_bytes(self) -> u64 {
        if self.fp8() {
            1
        } else {
            2
        }
    }

    /// Dynamic shared memory: the stages' A and B tiles, the two consumer warpgroups' 16 KiB
    /// output staging buffers, 1 KiB of alignment slack, two mbarriers per stage and the pingpong
    /// order's two.
    fn shared_memory(self) -> u32 {
        let stages = self.stages();
        stages * (128 + self.bn()) * 128 + 2 * 16384 + 1024 + stages * 16 + 16
    }
}

/// The operands of a grouped fprop/dgrad as the pointer-array path holds them: kernel A is the
/// activation (or gradient) rows `[P, K]`, kernel B the experts' weights.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Sm90Operands {
    /// Both BF16; `b_mn_major`: B is `[E, K, N]` (dgrad with the weights as stored), else
    /// `[E, N, K]`.
    Bf16 { b_mn_major: bool },
    /// Both FP8 E4M3 per-tensor, B `[E, N, K]` (fprop: the rowwise weights; dgrad: their
    /// columnwise per-expert transpose).
    E4m3 { fast_accum: bool },
    /// FP8 per-tensor E5M2 rows and E4M3 weights `[E, N, K]`: the hybrid recipes' dgrad (the
    /// gradient in E5M2, the weights' columnwise transpose in E4M3).
    E5m2E4m3 { fast_accum: bool },
}

impl Sm90Operands {
    /// From the cuBLAS view of the pointer array (cuBLAS A = the weights, `a_outer_major`
    /// whether they are `[E, outer = N, K]`; cuBLAS B = the activation rows).
    pub(crate) fn of(
        weights: DataType,
        weights_outer_major: bool,
        rows: DataType,
        fast_accum: bool,
    ) -> Option<Self> {
        match (weights, rows) {
            (DataType::CUDA_R_16BF, DataType::CUDA_R_16BF) => Some(Sm90Operands::Bf16 {
                b_mn_major: !weights_outer_major,
            }),
            (DataType::CUDA_R_8F_E4M3, DataType::CUDA_R_8F_E4M3) if weights_outer_major => {
                Some(Sm90Operands::E4m3 { fast_accum })
            }
            (DataType::CUDA_R_8F_E4M3, DataType::CUDA_R_8F_E5M2) if weights_outer_major => {
                Some(Sm90Operands::E5m2E4m3 { fast_accum })
            }
            _ => None,
        }
    }

    /// The kernel for a reduction of length `k`: BF16 always cooperative; FP8 with fast
    /// accumulation pingpong where the reduction takes at most 16 stages of 128 bytes (K <= 2048),
    /// cooperative otherwise; the split accumulator has only the cooperative kernel (its partial
    /// sums take the registers a pingpong tile needs). See the module docs for the measurements.
    fn variant(self, k: usize) -> Sm90Variant {
        let short = (k as u64).div_ceil(128) <= 16;
        match self {
            Sm90Operands::Bf16 { b_mn_major: false } => Sm90Variant::Bf16Tn,
            Sm90Operands::Bf16 { b_mn_major: true } => Sm90Variant::Bf16Nn,
            Sm90Operands::E4m3 { fast_accum: true } if short => Sm90Variant::E4m3TnPingpong,
            Sm90Operands::E4m3 { fast_accum: true } => Sm90Variant::E4m3Tn,
            Sm90Operands::E4m3 { fast_accum: false } => Sm90Variant::E4m3TnSplit,
            Sm90Operands::E5m2E4m3 { fast_accum: true } if short => Sm90Variant::E5m2TnPingpong,
            Sm90Operands::E5m2E4m3 { fast_accum: true } => Sm90Variant::E5m2Tn,
            Sm90Operands::E5m2E4m3 { fast_accum: false } => Sm90Variant::E5m2TnSplit,
        }
    }
}

/// The kernel that can run a grouped GEMM `D [rows, n] (BF16) = A [rows, k] · op(B_e)` over
/// `groups` experts on CUDA device `device`, or `None` (see the module docs; pointers are checked
/// by `Sm90GroupedGemm::aligned` once known).
pub(crate) fn variant(
    device: usize,
    operands: Option<Sm90Operands>,
    d: DataType,
    rows: usize,
    n: usize,
    k: usize,
    groups: usize,
) -> Option<Sm90Variant> {
    let variant = operands?.variant(k);
    let es = variant.element_bytes() as usize;
    // TMA: strides multiples of 16 bytes below 2^40, dimensions below 2^32; the kernel takes
    // `int` sizes and stores 16 bytes (8 BF16 columns) at a time.
    let fits = |v: usize| v >= 1 && v <= i32::MAX as usize;
    let ok = d == DataType::CUDA_R_16BF
        && fits(groups)
        && fits(rows)
        && rows % 128 == 0
        && fits(n)
        && fits(k)
        && (k * es) % 16 == 0
        && (n * es) % 16 == 0
        && (n * 2) % 16 == 0
        && (n as u64)
            .checked_mul(k as u64)
            .and_then(|nk| nk.checked_mul(es as u64))
            .is_some_and(|bytes| bytes < 1 << 40)
        && is_sm90(device);
    ok.then_some(variant)
}

/// One launch of our grouped GEMM (`sm90/grouped_gemm.cu`), with device pointers.
#[derive(Debug, Clone, Copy)]
pub struct Sm90GroupedGemm {
    pub variant: Sm90Variant,
    /// A `[rows, k]`: the activation (or gradient) rows, expert e's at its aligned rows.
    pub a: u64,
    /// B: the experts' weights, `[groups, n, k]` (K-major) or, `Bf16Nn`, `[groups, k, n]`.
    pub b: u64,
    /// D `[rows, ldd]` BF16; every row is written (rows past the filled chunks as zeros).
    pub d: u64,
    /// Rows of A and D (a multiple of 128: `rows / 128` chunks of capacity).
    pub rows: u64,
    /// Output columns and reduction length.
    pub n: u32,
    pub k: u32,
    pub ldd: u32,
    pub groups: u32,
    /// u32 `[groups]`: each expert's first aligned row and aligned row count (multiples of 128).
    pub group_start: u64,
    pub group_rows: u64,
    /// Dequantization scales `(f32 pointer, step)`: expert e's factor is `ptr[e * step]` (step 0:
    /// one shared value). `None` leaves the product unscaled.
    pub scale_a: Option<(u64, i32)>,
    pub scale_b: Option<(u64, i32)>,
}

impl Sm90GroupedGemm {
    /// Whether the buffers are where the kernel can read and write them: TMA operands and D (16-
    /// byte stores) 16-byte aligned, the u32 offsets and f32 scales 4-byte aligned.
    pub fn aligned(&self) -> bool {
        self.misaligned().is_none()
    }

    /// The first of this launch's buffers that is not aligned (`aligned`), for an error.
    pub fn misaligned(&self) -> Option<u64> {
        let words = [Some(self.group_start), Some(self.group_rows)]
            .into_iter()
            .chain([self.scale_a, self.scale_b].map(|s| s.map(|s| s.0)))
            .flatten()
            .find(|p| p % 4 != 0);
        [self.a, self.b, self.d].into_iter().find(|p| p % 16 != 0).or(words)
    }
}

/// `GroupedGemmArgs` of `sm90/grouped_gemm.cu`, byte for byte: six pointers, then eight ints.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct GroupedGemmArgs {
    d: u64,
    group_start: u64,
    group_rows: u64,
    scale_a: u64,
    scale_b: u64,
    bias: u64,
    ldd: i32,
    groups: i32,
    capacity_chunks: i32,
    n: i32,
    k: i32,
    scale_a_step: i32,
    scale_b_step: i32,
    band: i32,
}

const _: () = assert!(std::mem::size_of::<GroupedGemmArgs>() == 80);
// The kernels' `TensorMap`: 128 opaque bytes, 64-byte aligned (the driver's type is at least that).
const _: () = assert!(std::mem::size_of::<cuda::CUtensorMap>() == 128);
const _: () = assert!(std::mem::align_of::<cuda::CUtensorMap>() >= 64);

/// The kernels of one CUDA context (`Sm90Variant::ALL`).
pub(crate) struct Sm90Kernels {
    functions: Vec<CudaFunction>,
}

impl Sm90Kernels {
    /// Compiles `sm90/grouped_gemm.cu` with NVRTC for `sm_90a`, loads the eight kernels into `ctx`
    /// and allows each its dynamic shared memory. An NVRTC failure is an error carrying its log.
    pub(crate) fn compile(ctx: &Arc<CudaContext>) -> Result<Self> {
        use cudarc::nvrtc::{compile_ptx_with_opts, CompileError, CompileOptions};
        let ptx = compile_ptx_with_opts(
            include_str!("sm90/grouped_gemm.cu"),
            CompileOptions {
                arch: Some("sm_90a"),
                options: vec!["-std=c++17".into()],
                name: Some("grouped_gemm.cu".into()),
                ..Default::default()
            },
        )
        .map_err(|e| {
            let log = match &e {
                CompileError::CompileError { nvrtc, options, log } => format!(
                    "{nvrtc:?} with options {options:?}:\n{}",
                    log.to_string_lossy()
                ),
                other => format!("{other:?}"),
            };
            LowpError::invalid("NVRTC", "sm90/grouped_gemm.cu", log)
        })?;
        let driver = |what: &'static str| {
            move |e: cudarc::driver::DriverError| LowpError::invalid("CUDA driver", what, format!("{e:?}"))
        };
        let module = ctx.load_module(ptx).map_err(driver("load the sm90 grouped GEMM module"))?;
        let mut functions = Vec::with_capacity(Sm90Variant::ALL.len());
        for variant in Sm90Variant::ALL {
            let function = module.load_function(variant.name()).map_err(|e| {
                LowpError::invalid("CUDA driver", format!("kernel {}", variant.name()), format!("{e:?}"))
            })?;
            function
                .set_attribute(
                    cuda::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                    variant.shared_memory() as i32,
                )
                .map_err(|e| {
                    LowpError::invalid(
                        "CUDA driver",
                        format!("{} bytes of dynamic shared memory for {}", variant.shared_memory(), variant.name()),
                        format!("{e:?}"),
                    )
                })?;
            functions.push(function);
        }
        Ok(Sm90Kernels { functions })
    }

    /// Queues `g` on `stream` with a persistent grid of at most `ctas` CTAs (the caller's context
    /// current on this thread).
    ///
    /// # Safety
    /// Every pointer in `g` must be a live device allocation of the size its dimensions imply,
    /// until the launch has run.
    pub(crate) unsafe fn launch(&self, g: &Sm90GroupedGemm, stream: cuda::CUstream, ctas: u32) -> Result<()> {
        let v = g.variant;
        let capacity_chunks = g.rows / 128;
        if capacity_chunks == 0 {
            return Ok(());
        }
        let es = v.element_bytes();
        let (n, k, groups) = (g.n as u64, g.k as u64, g.groups as u64);
        let data_type = if v.fp8() {
            cuda::CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_UINT8
        } else {
            cuda::CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
        };
        let bk = (128 / es) as u32;
        // A [rows, k]: 128 bytes of K by 128 rows.
        let tm_a = unsafe { encode(data_type, g.a, &[k, g.rows], &[k * es], &[bk, 128]) }
            .map_err(|e| tensor_map_error("A", e))?;
        let tm_b = if v.mn_major() {
            // B [E, k, n], n contiguous: 64 columns by 64 K rows per box.
            unsafe { encode(data_type, g.b, &[n, k, groups], &[n * es, k * n * es], &[64, 64, 1]) }
        } else {
            // B [E, n, k], k contiguous: 128 bytes of K by BN rows.
            unsafe { encode(data_type, g.b, &[k, n, groups], &[k * es, n * k * es], &[bk, v.bn(), 1]) }
        }
        .map_err(|e| tensor_map_error("B", e))?;
        // D [rows, ldd] bf16: the epilogue's TMA stores, boxes of 64 columns by 64 rows (clipped
        // at column n).
        let tm_d = unsafe {
            encode(
                cuda::CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
                g.d,
                &[n, g.rows],
                &[g.ldd as u64 * 2],
                &[64, 64],
            )
        }
        .map_err(|e| tensor_map_error("D", e))?;
        let (scale_a, scale_a_step) = g.scale_a.unwrap_or((0, 0));
        let (scale_b, scale_b_step) = g.scale_b.unwrap_or((0, 0));
        let col_tiles = g.n.div_ceil(v.bn());
        let mut args = GroupedGemmArgs {
            d: g.d,
            group_start: g.group_start,
            group_rows: g.group_rows,
            scale_a,
            scale_b,
            bias: 0,
            ldd: g.ldd as i32,
            groups: g.groups as i32,
            capacity_chunks: capacity_chunks as i32,
            n: g.n as i32,
            k: g.k as i32,
            scale_a_step,
            scale_b_step,
            band: if col_tiles >= 16 { 16 } else { 1 },
        };
        let (mut tm_a, mut tm_b, mut tm_d) = (tm_a, tm_b, tm_d);
        // The kernel's four by-value parameters, as CubeCL passes tensor maps: the driver copies
        // each from its pointer when the launch is queued.
        let mut params = [
            &mut tm_a as *mut cuda::CUtensorMap as *mut c_void,
            &mut tm_b as *mut cuda::CUtensorMap as *mut c_void,
            &mut tm_d as *mut cuda::CUtensorMap as *mut c_void,
            &mut args as *mut GroupedGemmArgs as *mut c_void,
        ];
        let units = capacity_chunks.saturating_mul(col_tiles as u64);
        let grid = (ctas.max(1) as u64).min(units.max(1)) as u32;
        unsafe {
            cudarc::driver::result::launch_kernel(
                self.functions[v.index()].cu_function(),
                (grid, 1, 1),
                (384, 1, 1),
                v.shared_memory(),
                stream,
                &mut params,
            )
        }
        .map_err(|e| LowpError::invalid("CUDA driver", format!("launch {}", v.name()), format!("{e:?}")))
    }
}

fn tensor_map_error(operand: &str, e: cuda::CUresult) -> LowpError {
    LowpError::invalid(
        "cuTensorMapEncodeTiled",
        format!("operand {operand} of the sm90 grouped GEMM"),
        format!("{e:?}"),
    )
}

/// A tiled tensor map as the kernels read them (`harness.cu`'s `encode`): element strides 1, no
/// interleave, 128-byte swizzle, 256-byte L2 promotion, no OOB NaN fill (zeros).
unsafe fn encode(
    data_type: cuda::CUtensorMapDataType,
    base: u64,
    dims: &[u64],
    strides: &[u64],
    boxes: &[u32],
) -> std::result::Result<cuda::CUtensorMap, cuda::CUresult> {
    debug_assert!(dims.len() == boxes.len() && strides.len() + 1 == dims.len());
    let mut map = cuda::CUtensorMap { opaque: [0; 16] };
    let element_strides = [1u32; 3];
    let status = unsafe {
        cuda::cuTensorMapEncodeTiled(
            &mut map,
            data_type,
            dims.len() as u32,
            base as *mut c_void,
            dims.as_ptr(),
            strides.as_ptr(),
            boxes.as_ptr(),
            element_strides.as_ptr(),
            cuda::CUtensorMapInterleave::CU_TENSOR_MAP_INTERLEAVE_NONE,
            cuda::CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_128B,
            cuda::CUtensorMapL2promotion::CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
            cuda::CUtensorMapFloatOOBfill::CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
        )
    };
    match status {
        cuda::CUresult::CUDA_SUCCESS => Ok(map),
        e => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shared_memory_matches_the_kernels() {
        // 4 · (128 + 256) · 128 and 6 · (128 + 128) · 128 are 192 KiB; + 32 KiB of staging
        // + 1 KiB + barriers, within the 227 KiB a block may have on Hopper.
        assert_eq!(Sm90Variant::Bf16Tn.shared_memory(), 196_608 + 32_768 + 1024 + 64 + 16);
        assert_eq!(Sm90Variant::E4m3TnSplit.shared_memory(), 196_608 + 32_768 + 1024 + 96 + 16);
        assert_eq!(Sm90Variant::E4m3TnPingpong.shared_memory(), 196_608 + 32_768 + 1024 + 96 + 16);
        assert_eq!(Sm90Variant::E5m2Tn.shared_memory(), Sm90Variant::E4m3Tn.shared_memory());
        assert_eq!(Sm90Variant::E5m2TnSplit.shared_memory(), Sm90Variant::E4m3TnSplit.shared_memory());
        for v in Sm90Variant::ALL {
            assert!(v.shared_memory() <= 227 * 1024, "{}", v.name());
        }
        for (i, v) in Sm90Variant::ALL.into_iter().enumerate() {
            assert_eq!(v.index(), i);
        }
    }

    #[test]
    fn operands_pick_the_kernel() {
        let of = |w, outer, r, fast, k| Sm90Operands::of(w, outer, r, fast).map(|o| o.variant(k));
        use DataType::{CUDA_R_16BF as BF16, CUDA_R_16F as F16, CUDA_R_8F_E4M3 as E4M3, CUDA_R_8F_E5M2 as E5M2};
        // BF16 takes the cooperative kernels at every length; FP8 with fast accumulation the
        // pingpong one up to 16 stages.
        assert_eq!(of(BF16, true, BF16, false, 7168), Some(Sm90Variant::Bf16Tn));
        assert_eq!(of(BF16, true, BF16, false, 1024), Some(Sm90Variant::Bf16Tn));
        assert_eq!(of(BF16, false, BF16, false, 2048), Some(Sm90Variant::Bf16Nn));
        assert_eq!(of(BF16, false, BF16, false, 768), Some(Sm90Variant::Bf16Nn));
        assert_eq!(of(E4M3, true, E4M3, true, 7168), Some(Sm90Variant::E4m3Tn));
        assert_eq!(of(E4M3, true, E4M3, true, 2048), Some(Sm90Variant::E4m3TnPingpong));
        assert_eq!(of(E4M3, true, E4M3, true, 2049), Some(Sm90Variant::E4m3Tn));
        assert_eq!(of(E4M3, true, E4M3, false, 768), Some(Sm90Variant::E4m3TnSplit));
        // The hybrid recipes' dgrad: E5M2 gradient rows, E4M3 weights; the same kernels' choice.
        assert_eq!(of(E4M3, true, E5M2, false, 768), Some(Sm90Variant::E5m2TnSplit));
        assert_eq!(of(E4M3, true, E5M2, true, 768), Some(Sm90Variant::E5m2TnPingpong));
        assert_eq!(of(E4M3, true, E5M2, true, 7168), Some(Sm90Variant::E5m2Tn));
        assert_eq!(of(E5M2, true, E4M3, false, 768), None);
        assert_eq!(of(E5M2, true, E5M2, false, 768), None);
        assert_eq!(of(E4M3, false, E5M2, false, 768), None);
        assert_eq!(of(F16, true, F16, false, 768), None);
    }
}
