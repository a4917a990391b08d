//! Which device runtimes this machine has, asked without panicking: creating a CubeCL client for a
//! runtime that is absent panics inside a worker thread, so probe first.

/// True when a Vulkan adapter (a GPU, or Mesa's lavapipe on a CPU) is present.
#[cfg(feature = "wgpu")]
pub fn wgpu_available() -> bool {
    use burn_lowp_kernels::cubecl::wgpu::WgpuRuntime;
    use burn_lowp_kernels::cubecl::Runtime;
    !WgpuRuntime::enumerate_all_devices(&wgpu::Backend::Vulkan).is_empty()
}

/// True when the CUDA driver library loads and reports at least one device.
#[cfg(feature = "cuda")]
pub fn cuda_available() -> bool {
    use burn_lowp_kernels::cubecl::cuda::CudaRuntime;
    use burn_lowp_kernels::cubecl::Runtime;
    // SAFETY: only checks whether the driver library can be loaded.
    let driver = unsafe { cudarc::driver::sys::is_culib_present() };
    driver && !CudaRuntime::enumerate_all_devices(&()).is_empty()
}
