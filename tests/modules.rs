//! Quantized GEMMs and the Linear / LayerNormLinear modules, written once (`modules/suite.rs`,
//! with the checks in `modules/gemm.rs`, `modules/linear.rs`, `modules/grouped*.rs`) and
//! run on NdArray (the reference backend, CI) and CUDA (cuBLASLt, the GPU bundle): GEMMs against
//! an f64 reference, identity recipes against plain Burn, gradients against a high-precision
//! reference, a small MLP trained under every recipe file, the weight cache. CUDA adds the check
//! that cuBLASLt is ordered against CubeCL's stream without host synchronization.

mod common;

#[path = "modules/suite.rs"]
mod suite;

#[path = "modules/gemm.rs"]
mod gemm;

#[path = "modules/linear.rs"]
mod linear;

#[path = "modules/grouped.rs"]
mod grouped;

#[path = "modules/grouped_gemm.rs"]
mod grouped_gemm;

#[path = "modules/mlp.rs"]
mod mlp;

#[path = "modules/debug.rs"]
mod debug;

#[cfg(feature = "ndarray")]
mod ndarray {
    use burn::backend::NdArray;

    fn device() -> Option<burn::backend::ndarray::NdArrayDevice> {
        Some(Default::default())
    }

    crate::suite::module_suite!(NdArray, device(), crate::suite::Exactness::Reference);
    crate::grouped::grouped_suite!(NdArray, device(), crate::suite::Exactness::Reference);
    crate::mlp::mlp_suite!(NdArray, device(), crate::suite::Exactness::Reference);
    crate::debug::debug_suite!(NdArray, device(), crate::suite::Exactness::Reference);
}

#[cfg(feature = "cuda")]
mod cuda {
    use burn_cubecl::CubeBackend;
    use burn_lowp_kernels::cubecl::cuda::{CudaDevice, CudaRuntime};

    type Backend = CubeBackend<CudaRuntime, f32, i32, u8>;

    fn device() -> Option<CudaDevice> {
        crate::common::cuda_device()
    }

    crate::suite::module_suite!(Backend, device(), crate::suite::Exactness::Gpu);
    crate::grouped::grouped_suite!(Backend, device(), crate::suite::Exactness::Gpu);
    crate::mlp::mlp_suite!(Backend, device(), crate::suite::Exactness::Gpu);
    crate::debug::debug_suite!(Backend, device(), crate::suite::Exactness::Gpu);

    #[test]
    fn grouped_fprop_and_dgrad_take_the_graph_safe_path() {
        if let Some(d) = device() {
            crate::grouped_gemm::check_grouped_device_splits_path::<Backend>(&d);
        }
    }

    #[test]
    fn grouped_exact_batches_equal_the_bound() {
        if let Some(d) = device() {
            crate::grouped_gemm::check_grouped_exact_batches_equal_bound::<Backend>(&d);
        }
    }

    #[test]
    fn grouped_split_copy_is_seen_once_arrived() {
        if let Some(d) = device() {
            crate::grouped_gemm::check_grouped_split_copy_is_seen_once_arrived::<Backend>(&d);
        }
    }

    #[test]
    fn grouped_deferred_scales_equal_the_scale_pass() {
        if let Some(d) = device() {
            crate::grouped_gemm::check_grouped_deferred_scales_equal_the_scale_pass::<Backend>(&d);
        }
    }

    #[test]
    fn grouped_sm90_bound_equals_the_exact_batch() {
        if let Some(d) = device() {
            let sm90 = burn_lowp::backend::cuda::sm90_grouped::is_sm90(d.index);
            crate::grouped_gemm::check_grouped_sm90_bound_equals_the_exact_batch::<Backend>(&d, sm90);
        }
    }

    #[test]
    fn grouped_large_known_groups_run_per_group() {
        if let Some(d) = device() {
            crate::grouped_gemm::check_grouped_large_known_groups_run_per_group::<Backend>(&d);
        }
    }

    #[test]
    fn gemm_tuning_file_reuses_algorithms() {
        if let Some(d) = device() {
            let index = d.index;
            crate::gemm::check_gemm_tuning_file_reuses_algorithms::<Backend>(&d, move || {
                burn_lowp::backend::cuda::cublaslt::reset_gemm_plans(index).unwrap()
            });
        }
    }

    /// GEMMs whose inputs CubeCL writes just before and whose outputs CubeCL reads just after,
    /// ordered by device flags: the results equal those of the host-synchronized ordering, and no
    /// wait kernel timed out.
    #[test]
    fn cublaslt_is_ordered_against_cubecl_without_host_sync() {
        if let Some(d) = device() {
            crate::gemm::check_stream_ordering::<Backend>(&d);
        }
    }
}
