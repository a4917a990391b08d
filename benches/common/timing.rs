//! Timing shared by the CUDA benchmarks: wall clock around back-to-back calls between two device
//! synchronizations.

use std::time::Instant;

use burn_lowp_kernels::cubecl::cuda::CudaRuntime;
use burn_lowp_kernels::cubecl::prelude::*;

pub fn sync(client: &ComputeClient<CudaRuntime>) {
    burn_lowp_kernels::cubecl::future::block_on(client.sync()).expect("device sync");
}

/// Seconds per call of `f`: after three warm-up calls (kernel compilation, algorithm choice), the
/// best of `runs` timed runs of `iterations` calls, so that a clock or power dip in one run does
/// not decide a ratio.
pub fn time(
    client: &ComputeClient<CudaRuntime>,
    iterations: usize,
    runs: usize,
    mut f: impl FnMut(),
) -> f64 {
    for _ in 0..3 {
        f();
    }
    sync(client);
    (0..runs)
        .map(|_| {
            let start = Instant::now();
            for _ in 0..iterations {
                f();
            }
            sync(client);
            start.elapsed().as_secs_f64() / iterations as f64
        })
        .fold(f64::INFINITY, f64::min)
}

/// Host seconds per call: the wall clock of `iterations` back-to-back calls before the device is
/// synchronized (what the CPU spends enqueueing; equals the time per call when the host bounds).
/// Not every bench that includes this file reports host time.
#[allow(dead_code)]
pub fn host_time(client: &ComputeClient<CudaRuntime>, iterations: usize, mut f: impl FnMut()) -> f64 {
    sync(client);
    let start = Instant::now();
    for _ in 0..iterations {
        f();
    }
    let host = start.elapsed().as_secs_f64() / iterations as f64;
    sync(client);
    host
}
