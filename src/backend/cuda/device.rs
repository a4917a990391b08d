//! Which CUDA device a CubeCL client or device is, and the device attributes the GEMM paths ask
//! for (compute capability, multiprocessors), each read once per device.

use std::any::Any;

use burn_cubecl::CubeRuntime;
use burn_lowp_kernels::cubecl::cuda::{CudaDevice, CudaRuntime};
use burn_lowp_kernels::cubecl::prelude::*;

/// True when `R` is CubeCL's CUDA runtime.
pub fn is_cuda<R: CubeRuntime>() -> bool {
    std::any::TypeId::of::<R>() == std::any::TypeId::of::<CudaRuntime>()
}

/// The CUDA client of a client of runtime `R` (`R` is `CudaRuntime`: see `is_cuda`).
pub(crate) fn cuda_client<R: CubeRuntime>(client: &ComputeClient<R>) -> &ComputeClient<CudaRuntime> {
    (client as &dyn Any)
        .downcast_ref()
        .expect("called only when R is CudaRuntime")
}

/// The CUDA device index of a device of runtime `R` (`R` is `CudaRuntime`).
pub(crate) fn cuda_device<R: CubeRuntime>(device: &R::Device) -> usize {
    (device as &dyn Any)
        .downcast_ref::<CudaDevice>()
        .expect("called only when R is CudaRuntime")
        .index
}

/// A CUDA device attribute, read once per device and attribute (0 if it cannot be read).
pub(crate) fn device_attribute(device: usize, attribute: cudarc::driver::sys::CUdevice_attribute) -> i32 {
    type Cache = std::sync::Mutex<std::collections::HashMap<(usize, i32), i32>>;
    static CACHE: std::sync::OnceLock<Cache> = std::sync::OnceLock::new();
    let mut cache = CACHE.get_or_init(Default::default).lock().expect("device attribute cache");
    *cache.entry((device, attribute as i32)).or_insert_with(|| {
        cudarc::driver::CudaContext::new(device)
            .and_then(|ctx| ctx.attribute(attribute))
            .unwrap_or(0)
    })
}

/// Whether the device is a Hopper GPU (compute capability 9.x).
pub(crate) fn is_hopper(device: usize) -> bool {
    use cudarc::driver::sys::CUdevice_attribute as A;
    device_attribute(device, A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR) == 9
}

/// The device's streaming multiprocessors (at least 1).
pub(crate) fn multiprocessors(device: usize) -> usize {
    use cudarc::driver::sys::CUdevice_attribute as A;
    device_attribute(device, A::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT).max(1) as usize
}
