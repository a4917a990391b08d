//! The runtime choices the cast launchers make, and the switches benchmarks and tests use to
//! override them: which FP8 encoder a runtime's kernels use (conversion instruction or integer
//! arithmetic), whether MXFP8 / FP8 block / NVFP4 take their tile kernels for every case, and
//! whether per-row loops are unrolled. Every choice gives the same bytes.

use cubecl::prelude::*;

use crate::cast::codec::Fp8Encoder;

/// Whether to fully unroll the kernels' per-row loops: yes on CUDA (register arrays), no on wgpu,
/// where CubeCL's optimizer takes minutes over the unrolled IR and lavapipe gains nothing.
pub(crate) fn unroll<R: Runtime>(client: &ComputeClient<R>) -> bool {
    !R::name(client).starts_with("wgpu")
}

static INTEGER_FP8_ENCODER: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Makes every runtime use the integer FP8 encoder from the next launch on (`false`: each
/// runtime's own choice again). For benchmarks and tests comparing the two; both give the same codes.
pub fn force_integer_fp8_encoder(force: bool) {
    INTEGER_FP8_ENCODER.store(force, std::sync::atomic::Ordering::Relaxed);
}

thread_local! {
    static TILE_QUANTIZE_KERNELS: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Makes MXFP8, FP8 block and NVFP4 quantization launched from this thread use their tile
/// kernels (`mxfp8_kernel`, `fp8_block_kernel`, `nvfp4_kernel`) for every case they take (`false`:
/// the launcher's choice again, which takes `mxfp8_strip_kernel` / `fp8_block_transposed_kernel`
/// / `nvfp4_strip_kernel` for most 16-bit cases, and `nvfp4_rowwise_kernel` for NVFP4's 1D
/// rowwise-only casts). For benchmarks and tests comparing them; all give the same bytes. Per
/// thread, so that a test forcing it does not change the kernels of tests running beside it.
pub fn force_tile_quantize_kernels(force: bool) {
    TILE_QUANTIZE_KERNELS.with(|f| f.set(force));
}

pub(crate) fn tile_kernels_forced() -> bool {
    TILE_QUANTIZE_KERNELS.with(|f| f.get())
}

/// The FP8 encoder for a runtime: the conversion instruction on CUDA devices that have it (sm_89+;
/// CubeCL registers FP8 conversions there, and the vendored code generator makes them saturate),
/// integer arithmetic elsewhere (wgpu's FP8 conversions, where a Vulkan driver has them, are not
/// known to round and saturate as the formats need).
pub fn fp8_encoder<R: Runtime>(client: &ComputeClient<R>) -> Fp8Encoder {
    use cubecl::ir::features::{EnumSet, TypeUsage};
    let converts = |usage: EnumSet<TypeUsage>| usage.contains(TypeUsage::Conversion);
    if !INTEGER_FP8_ENCODER.load(std::sync::atomic::Ordering::Relaxed)
        && R::name(client) == "cuda"
        && converts(cubecl::e4m3::supported_uses(client))
        && converts(cubecl::e5m2::supported_uses(client))
    {
        Fp8Encoder::Instruction
    } else {
        Fp8Encoder::Integer
    }
}
