//! Our streams' own kernels (`stream_kernels.cu`: the pointer arrays of a pointer-array batch,
//! the wait for CubeCL's READY flag), compiled with NVRTC on first use per context.

use std::sync::Arc;

use burn_lowp_kernels::stream_flags::{READY, TIMED_OUT};
use cudarc::driver::CudaContext;

use super::instance::driver_error;
use crate::error::{LowpError, Result};

pub(super) struct OurKernels {
    pub(super) wait_ready: cudarc::driver::CudaFunction,
    pub(super) fill_pointers: cudarc::driver::CudaFunction,
}

/// Compiles our streams' kernels (`stream_kernels.cu`, which says what each does and why) for
/// `ctx`, the flag words' indices defined before the source.
pub(super) fn compile_our_kernels(ctx: &Arc<CudaContext>) -> Result<OurKernels> {
    let source = format!(
        "#define LOWP_FLAG_READY {READY}\n#define LOWP_FLAG_TIMED_OUT {TIMED_OUT}\n{}",
        include_str!("stream_kernels.cu")
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
