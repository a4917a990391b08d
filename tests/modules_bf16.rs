//! CUDA: the small MLP of `modules/linear.rs` trained under every recipe file on a BF16
//! `CubeBackend` (BF16 parameters and activations, f32 scales and amaxes), which is how models
//! train on a GPU. Its own test binary because Burn keeps default dtypes per device, not per
//! backend type: in one process, the first backend to touch CUDA device 0 decides the float
//! type that every other backend's new tensors on it get.

mod common;

#[allow(dead_code, unused_macros, unused_imports)]
#[path = "modules/suite.rs"]
mod suite;

#[allow(dead_code, unused_imports)]
#[path = "modules/linear.rs"]
mod linear;

#[cfg(feature = "cuda")]
mod cuda {
    use burn_cubecl::CubeBackend;
    use burn_lowp_kernels::cubecl::cuda::CudaRuntime;

    type Bf16Backend = CubeBackend<CudaRuntime, half::bf16, i32, u8>;

    #[test]
    fn a_small_bf16_mlp_learns_under_every_recipe_file() {
        if let Some(d) = crate::common::cuda_device() {
            crate::linear::check_mlp_learns_under_every_recipe::<Bf16Backend>(&d);
        }
    }
}
