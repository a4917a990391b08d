//! The quantize/dequantize kernels through `LowpBackend`, bit for bit against the reference
//! quantizers, on every backend this build has: NdArray always, wgpu (lavapipe in CI) with the
//! `wgpu` feature, CUDA with the `cuda` feature. One suite, instantiated per backend.
//!
//! Without a Vulkan adapter the wgpu tests say so and pass, unless `LOWP_REQUIRE_WGPU=1` (which
//! `.ci/run` sets); likewise CUDA with `LOWP_REQUIRE_CUDA=1`
//! (`LOWP_TEST_DEVICE=cuda`, as `tests/run_cuda_tests.sh` sets, implies it).

mod common;

#[path = "kernels/suite.rs"]
mod suite;

#[path = "kernels/cast.rs"]
mod cast;

#[path = "kernels/delayed_scaling.rs"]
mod delayed_scaling;

#[path = "kernels/grouped.rs"]
mod grouped;

#[path = "kernels/norm_act.rs"]
mod norm_act;

#[path = "kernels/stats.rs"]
mod stats;

#[path = "kernels/fused.rs"]
mod fused;

#[path = "kernels/routing.rs"]
mod routing;

#[cfg(any(feature = "wgpu", feature = "cuda"))]
#[path = "kernels/zeroed.rs"]
mod zeroed;

#[cfg(any(feature = "wgpu", feature = "cuda"))]
#[path = "kernels/gemm_block_scales.rs"]
mod gemm_block_scales;

#[cfg(any(feature = "wgpu", feature = "cuda"))]
#[path = "kernels/sum_squares.rs"]
mod sum_squares;

#[cfg(feature = "cuda")]
#[path = "kernels/stats_trees.rs"]
mod stats_trees;

#[cfg(feature = "ndarray")]
mod ndarray {
    use burn::backend::NdArray;
    use burn_lowp::format::InputDtype;
    crate::suite::kernel_suite!(NdArray, Some(Default::default()), [InputDtype::F32]);
    crate::norm_act::norm_act_suite!(NdArray, Some(Default::default()), [InputDtype::F32], false);
    crate::stats::stats_suite!(NdArray, Some(Default::default()), [InputDtype::F32], false);
    crate::fused::fused_suite!(NdArray, Some(Default::default()), [InputDtype::F32], true);
    crate::routing::routing_suite!(NdArray, Some(Default::default()), [InputDtype::F32]);
}

#[cfg(feature = "wgpu")]
mod wgpu {
    use burn_cubecl::CubeBackend;
    use burn_lowp::format::InputDtype;
    use burn_lowp_kernels::cubecl::wgpu::{WgpuDevice, WgpuRuntime};

    type Backend = CubeBackend<WgpuRuntime, f32, i32, u32>;

    /// The default wgpu device if a Vulkan adapter exists.
    fn device() -> Option<WgpuDevice> {
        crate::common::probe_device(
            "wgpu",
            "LOWP_REQUIRE_WGPU",
            burn_lowp::backend::device::wgpu_available,
        )
        .then(WgpuDevice::default)
    }

    crate::suite::kernel_suite!(
        Backend,
        device(),
        [InputDtype::F32, InputDtype::F16, InputDtype::BF16]
    );
    crate::norm_act::norm_act_suite!(
        Backend,
        device(),
        [InputDtype::F32, InputDtype::F16, InputDtype::BF16],
        true
    );
    crate::stats::stats_suite!(
        Backend,
        device(),
        [InputDtype::F32, InputDtype::F16, InputDtype::BF16],
        true
    );
    // The AdamW check's Burn-op twin casts to f32 with Burn's kernels, which have no bf16 on
    // wgpu (training on wgpu uses f32 parameters).
    crate::fused::fused_suite!(Backend, device(), [InputDtype::F32], false);
    crate::routing::routing_suite!(
        Backend,
        device(),
        [InputDtype::F32, InputDtype::F16, InputDtype::BF16]
    );
    crate::zeroed::zeroed_suite!(WgpuRuntime, device());
    crate::sum_squares::sum_squares_suite!(WgpuRuntime, device());
    crate::gemm_block_scales::gemm_block_scales_suite!(WgpuRuntime, device());
}

#[cfg(feature = "cuda")]
mod cuda {
    use burn_cubecl::CubeBackend;
    use burn_lowp::format::InputDtype;
    use burn_lowp_kernels::cubecl::cuda::{CudaDevice, CudaRuntime};

    type Backend = CubeBackend<CudaRuntime, f32, i32, u8>;

    fn device() -> Option<CudaDevice> {
        crate::common::cuda_device()
    }

    crate::suite::kernel_suite!(
        Backend,
        device(),
        [InputDtype::F32, InputDtype::F16, InputDtype::BF16]
    );
    crate::norm_act::norm_act_suite!(
        Backend,
        device(),
        [InputDtype::F32, InputDtype::F16, InputDtype::BF16],
        true
    );
    crate::stats::stats_suite!(
        Backend,
        device(),
        [InputDtype::F32, InputDtype::F16, InputDtype::BF16],
        true
    );
    crate::fused::fused_suite!(
        Backend,
        device(),
        [InputDtype::F32, InputDtype::F16, InputDtype::BF16],
        false
    );
    crate::routing::routing_suite!(
        Backend,
        device(),
        [InputDtype::F32, InputDtype::F16, InputDtype::BF16]
    );
    crate::zeroed::zeroed_suite!(CudaRuntime, device());
    crate::sum_squares::sum_squares_suite!(CudaRuntime, device());
    crate::gemm_block_scales::gemm_block_scales_suite!(CudaRuntime, device());
    crate::stats_trees::stats_trees_suite!(CudaRuntime, device());
}
