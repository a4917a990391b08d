//! Our Hopper K-grouped weight gradient (`lowp_grouped_wgrad_*` in `sm90/grouped_gemm.cu`):
//! `dW_e = dY_eᵀ · X_e` for every expert in one persistent launch, the reduction over each
//! expert's aligned token rows read on the device, instead of one cuBLASLt GEMM per expert on the
//! splits' host copy (`grouped::per_group`). Work units are (expert, 128 rows, 256 columns) of
//! `dW [E, out, in]`; an empty expert writes zeros, or leaves an accumulated output alone.
//!
//! Wired for BF16: dY `[P, out]` and X `[P, in]` read as stored (wgmma MN-major, 64 x 64 TMA
//! boxes), the output f32 (optionally added to: `fuse_wgrad_accumulation`) or BF16. The FP8
//! kernels exist in the `.cu` for the probe only: they read whole transposes `[cols, P]`, which
//! the grouped FP8 cast does not write yet (docs/fine-grained-moe.md).
//!
//! Compiled and loaded with the fprop/dgrad kernels (`sm90_grouped::Sm90Kernels`), launched on
//! the stream cuBLASLt's GEMMs use (`cublaslt::GroupWork::Sm90Wgrad`), so every
//! `StreamOrdering` orders it as it orders cuBLASLt. Launch (as `benches/sm90_probe/harness.cu`):
//! grid = min(SMs, units), 384 threads, dynamic shared memory `stages · (128 + BN) · 128 + 1024 +
//! stages · 16` bytes, arguments two `CUtensorMap`s and [`GroupedWgradArgs`] by value.
//!
//! Whether it runs is a process-wide setting, [`GroupedWgrad`]: [`set_grouped_wgrad`], else
//! `LOWP_GROUPED_WGRAD=cublaslt|sm90` (read once per process), else `Sm90`, which falls back to
//! the per-expert cuBLASLt GEMMs wherever the kernel does not apply (`wgrad_fits`).

use std::ffi::c_void;

use cudarc::driver::{sys as cuda, CudaFunction, CudaModule};

use super::setting::Setting;
use super::sm90_grouped::{encode, is_sm90, tensor_map_error};
use crate::error::{LowpError, Result};

/// Which GEMMs run a grouped weight gradient (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GroupedWgrad {
    /// The default: one cuBLASLt GEMM per non-empty expert, on the splits' host copy.
    CublasLt,
    /// Our K-grouped kernel where it applies, else `CublasLt`'s GEMMs. Experimental: it equals
    /// the reference in `cuda::grouped_sm90_wgrad_equals_the_reference`, but the MoE example's
    /// bf16 runs with it ended in an illegal memory access or a NaN loss (H200, 2026-11-27), and
    /// it does not check the splits, so bad splits are not reported.
    Sm90,
}

/// `LOWP_GROUPED_WGRAD=cublaslt|sm90`, in `GroupedWgrad` order; default `cublaslt`.
static WGRAD: Setting = Setting::new("LOWP_GROUPED_WGRAD", ["cublaslt", "sm90"], 0);

/// The setting in use: set by [`set_grouped_wgrad`], else `LOWP_GROUPED_WGRAD`, else `CublasLt`.
pub fn grouped_wgrad() -> GroupedWgrad {
    match WGRAD.get() {
        0 => GroupedWgrad::CublasLt,
        _ => GroupedWgrad::Sm90,
    }
}

pub fn set_grouped_wgrad(wgrad: GroupedWgrad) {
    WGRAD.set(match wgrad {
        GroupedWgrad::CublasLt => 0,
        GroupedWgrad::Sm90 => 1,
    });
}

/// The kernels the crate launches (BF16 only so far).
pub(crate) const WGRAD_KERNELS: [&str; 1] = ["lowp_grouped_wgrad_bf16_256"];

/// Output columns per tile and pipeline stages of `lowp_grouped_wgrad_bf16_256`.
const BN: u32 = 256;
const STAGES: u32 = 4;

/// Dynamic shared memory: the stages' A and B tiles, 1 KiB of alignment slack, two mbarriers per
/// stage.
pub(crate) const fn wgrad_shared_memory() -> u32 {
    STAGES * (128 + BN) * 128 + 1024 + STAGES * 16
}

/// Whether the BF16 kernel takes `dW [groups, m, n] = dYᵀ [m, P] · X [P, n]` on CUDA device
/// `device`: sm_90, rows of both operands multiples of 16 bytes (TMA strides), `n` even (pairs
/// stored), sizes that fit the kernel's `int`s and TMA's dimensions.
pub(crate) fn wgrad_fits(device: usize, rows: usize, m: usize, n: usize, groups: usize) -> bool {
    let fits = |v: usize| v >= 1 && v <= i32::MAX as usize;
    fits(groups)
        && fits(rows)
        && fits(m)
        && fits(n)
        && (m * 2) % 16 == 0
        && (n * 2) % 16 == 0
        && (groups as u64)
            .checked_mul(m as u64)
            .and_then(|v| v.checked_mul(n as u64))
            .is_some_and(|elements| elements <= i64::MAX as u64 / 4)
        && is_sm90(device)
}

/// One launch of the BF16 K-grouped weight gradient, with device pointers.
#[derive(Debug, Clone, Copy)]
pub struct Sm90GroupedWgrad {
    /// dY `[rows, m]` BF16, row-major; expert e's rows at its aligned offsets.
    pub dy: u64,
    /// X `[rows, n]` BF16, row-major.
    pub x: u64,
    /// dW `[groups, m, n]`, f32 (`f32`) or BF16.
    pub d: u64,
    pub rows: u64,
    pub m: u32,
    pub n: u32,
    pub groups: u32,
    /// u32 `[groups]`: each expert's first aligned row and aligned row count (multiples of 128).
    pub group_start: u64,
    pub group_rows: u64,
    /// f32 output; `accumulate` (f32 only): add to what `d` holds.
    pub f32: bool,
    pub accumulate: bool,
}

impl Sm90GroupedWgrad {
    /// The first buffer the kernel cannot use: operands 16-byte aligned (TMA), D 8-byte (f32
    /// pairs) or 4-byte (BF16 pairs), the u32 offsets 4-byte.
    pub fn misaligned(&self) -> Option<u64> {
        let d_align = if self.f32 { 8 } else { 4 };
        [(self.dy, 16), (self.x, 16), (self.d, d_align), (self.group_start, 4), (self.group_rows, 4)]
            .into_iter()
            .find(|(p, align)| p % align != 0)
            .map(|(p, _)| p)
    }
}

/// `GroupedWgradArgs` of `sm90/grouped_gemm.cu`, byte for byte: five pointers, six ints.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct GroupedWgradArgs {
    d: u64,
    group_start: u64,
    group_rows: u64,
    scale_a: u64,
    scale_b: u64,
    groups: i32,
    m: i32,
    n: i32,
    scale_a_step: i32,
    scale_b_step: i32,
    flags: i32,
}

const _: () = assert!(std::mem::size_of::<GroupedWgradArgs>() == 64);

/// The kernel's flags (`LOWP_WGRAD_F32`, `LOWP_WGRAD_ACCUMULATE`).
const WGRAD_F32: i32 = 1;
const WGRAD_ACCUMULATE: i32 = 2;

/// Loads [`WGRAD_KERNELS`] from the compiled module and allows each its dynamic shared memory.
pub(crate) fn load_wgrad(module: &std::sync::Arc<CudaModule>) -> Result<Vec<CudaFunction>> {
    WGRAD_KERNELS
        .iter()
        .map(|name| {
            let function = module
                .load_function(name)
                .map_err(|e| LowpError::invalid("CUDA driver", format!("kernel {name}"), format!("{e:?}")))?;
            function
                .set_attribute(
                    cuda::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                    wgrad_shared_memory() as i32,
                )
                .map_err(|e| {
                    LowpError::invalid(
                        "CUDA driver",
                        format!("{} bytes of dynamic shared memory for {name}", wgrad_shared_memory()),
                        format!("{e:?}"),
                    )
                })?;
            Ok(function)
        })
        .collect()
}

/// Queues `g` on `stream` with a persistent grid of at most `ctas` CTAs (the caller's context
/// current on this thread).
///
/// # Safety
/// Every pointer in `g` must be a live device allocation of the size its dimensions imply, until
/// the launch has run.
pub(crate) unsafe fn launch_wgrad(
    function: &CudaFunction,
    g: &Sm90GroupedWgrad,
    stream: cuda::CUstream,
    ctas: u32,
) -> Result<()> {
    let (m, n, rows) = (g.m as u64, g.n as u64, g.rows);
    if rows == 0 || g.groups == 0 {
        return Ok(());
    }
    let bf16 = cuda::CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
    // [rows, cols] bf16, cols contiguous: 64 columns by 64 K rows a box.
    let mut tm_a = unsafe { encode(bf16, g.dy, &[m, rows], &[m * 2], &[64, 64]) }
        .map_err(|e| tensor_map_error("dY of the grouped wgrad", e))?;
    let mut tm_b = unsafe { encode(bf16, g.x, &[n, rows], &[n * 2], &[64, 64]) }
        .map_err(|e| tensor_map_error("X of the grouped wgrad", e))?;
    let flags = match (g.f32, g.accumulate) {
        (true, true) => WGRAD_F32 | WGRAD_ACCUMULATE,
        (true, false) => WGRAD_F32,
        (false, _) => 0,
    };
    let mut args = GroupedWgradArgs {
        d: g.d,
        group_start: g.group_start,
        group_rows: g.group_rows,
        scale_a: 0,
        scale_b: 0,
        groups: g.groups as i32,
        m: g.m as i32,
        n: g.n as i32,
        scale_a_step: 0,
        scale_b_step: 0,
        flags,
    };
    let mut params = [
        &mut tm_a as *mut cuda::CUtensorMap as *mut c_void,
        &mut tm_b as *mut cuda::CUtensorMap as *mut c_void,
        &mut args as *mut GroupedWgradArgs as *mut c_void,
    ];
    let units = (g.groups as u64) * m.div_ceil(128) * n.div_ceil(BN as u64);
    let grid = (ctas.max(1) as u64).min(units.max(1)) as u32;
    unsafe {
        cudarc::driver::result::launch_kernel(
            function.cu_function(),
            (grid, 1, 1),
            (384, 1, 1),
            wgrad_shared_memory(),
            stream,
            &mut params,
        )
    }
    .map_err(|e| LowpError::invalid("CUDA driver", format!("launch {}", WGRAD_KERNELS[0]), format!("{e:?}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wgrad_shared_memory_matches_the_kernel() {
        // 4 · (128 + 256) · 128 = 192 KiB + 1 KiB + 4 · 16 bytes of barriers.
        assert_eq!(wgrad_shared_memory(), 196_608 + 1024 + 64);
        assert!(wgrad_shared_memory() <= 227 * 1024);
    }
}
