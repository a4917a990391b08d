//! Train a small mixture-of-experts language model under a low-precision recipe:
//!
//! ```text
//! cargo run --release --example moe_train -- --recipe recipes/mxfp8.json
//! cargo run --release --example moe_train -- --compare recipes/bf16.json recipes/current_scaling.json
//! cargo run --release --features cuda --example moe_train -- --config configs/moe-235m.json --recipe recipes/block_scaling.json
//! ```
//!
//! The backend comes from the features: the CPU (NdArray) by default, CUDA with `--features cuda`
//! (bf16 activations and weights, cuBLASLt GEMMs), wgpu with `--features wgpu`; `--backend`
//! picks among those compiled in. The model is the library's (`burn_lowp::moe::MoeLm`); what
//! trains it is here:
//!
//! * `args`: the command line; `command`: one recipe or `--compare` several, the chart and table;
//! * `run_config`: the config file (`configs/*.json`); `data`: byte-level text and its batches;
//! * `train`: the training loop under one recipe; `summary`: what a run measured;
//! * `checkpoint`: save and resume; `plot`: loss curves; `host_profile`: `--host-profile`;
//! * `parallel`: a data parallel rank's part of the loop; `distributed`: joining the ranks on
//!   CUDA (`--features nccl`; `--nproc-per-node N` starts N ranks, torchrun's variables work too).

mod args;
mod checkpoint;
mod command;
mod data;
#[cfg(feature = "nccl")]
mod distributed;
mod host_profile;
mod parallel;
mod plot;
mod run_config;
mod summary;
mod train;

#[cfg(test)]
mod tests;
// The integration tests' helpers, which the tests above share: the recipe files (`suite::recipe`,
// `suite::RECIPES`; `suite` reads them through `crate::common`, so both sit at the crate root).
#[cfg(test)]
#[path = "../../tests/common/mod.rs"]
mod common;
#[cfg(test)]
#[allow(dead_code, unused_macros, unused_imports)]
#[path = "../../tests/modules/suite.rs"]
mod suite;

use std::ffi::OsString;
use std::process::ExitCode;

use burn::backend::Autodiff;
use clap::Parser;

use args::MoeTrainArgs;
use command::run;

fn main() -> ExitCode {
    let raw: Vec<OsString> = std::env::args_os().skip(1).collect();
    match burn_lowp::dist::launcher::take_nproc_arg(&raw) {
        Ok((Some(n), rest)) => return launch_ranks(n, rest),
        Ok((None, _)) => {}
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    }
    let args = MoeTrainArgs::parse();
    let env = match burn_lowp::dist::LaunchEnv::from_env() {
        Ok(env) => env,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    let compiled = compiled_backends();
    let backend = match &args.backend {
        Some(name) if compiled.contains(&name.as_str()) => name.clone(),
        Some(name) => {
            eprintln!(
                "error: --backend {name} is not compiled in; this build has {} (CUDA needs --features cuda, wgpu --features wgpu)",
                compiled.join(", ")
            );
            return ExitCode::from(2);
        }
        None => compiled[0].to_string(),
    };
    println!("backend: {backend}");
    let result = match backend.as_str() {
        #[cfg(feature = "cuda")]
        "cuda" => cuda::train(&args, env),
        _ if env.is_distributed() => Err(burn_lowp::error::LowpError::invalid(
            "WORLD_SIZE",
            env.world_size,
            "a multi-rank run needs the CUDA backend (--features nccl)",
        )),
        #[cfg(feature = "wgpu")]
        "wgpu" => wgpu::train(&args),
        #[cfg(feature = "ndarray")]
        "cpu" => {
            let device = burn::backend::ndarray::NdArrayDevice::Cpu;
            run::<Autodiff<burn::backend::NdArray>>(&args, &device, None).map(|_| ())
        }
        other => unreachable!("backend {other} was checked against the compiled ones"),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// `--nproc-per-node N`: starts N ranks of this program on this host (one GPU each) with the
/// other arguments, and waits for them (`burn_lowp::dist::launcher`).
fn launch_ranks(n: usize, rest: Vec<OsString>) -> ExitCode {
    if !cfg!(feature = "nccl") {
        eprintln!("error: --nproc-per-node needs a build with --features nccl");
        return ExitCode::from(2);
    }
    let launched = burn_lowp::dist::launcher::LaunchOptions::current_exe(n, rest)
        .and_then(|options| burn_lowp::dist::launcher::launch(&options));
    match launched {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The backends this build has, the preferred (fastest) first.
fn compiled_backends() -> Vec<&'static str> {
    let mut names = Vec::new();
    if cfg!(feature = "cuda") {
        names.push("cuda");
    }
    if cfg!(feature = "wgpu") {
        names.push("wgpu");
    }
    if cfg!(feature = "ndarray") {
        names.push("cpu");
    }
    names
}

#[cfg(feature = "cuda")]
mod cuda {
    use burn::backend::Autodiff;
    use burn_cubecl::CubeBackend;
    use burn_lowp::dist::LaunchEnv;
    use burn_lowp::error::LowpError;

    use crate::args::MoeTrainArgs;
    use crate::command::run;
    use burn_lowp_kernels::cubecl::cuda::{CudaDevice, CudaRuntime};
    use burn_lowp_kernels::cubecl::Runtime;

    /// bf16 weights and activations (the recipes' high precision), f32 master math where the
    /// recipe asks for it; cuBLASLt for the GEMMs.
    pub type Backend = Autodiff<CubeBackend<CudaRuntime, half::bf16, i32, u8>>;

    pub fn train(args: &MoeTrainArgs, env: LaunchEnv) -> Result<(), LowpError> {
        if env.is_distributed() {
            #[cfg(feature = "nccl")]
            return crate::distributed::train(args, env);
            #[cfg(not(feature = "nccl"))]
            return Err(LowpError::invalid(
                "WORLD_SIZE",
                env.world_size,
                "a multi-rank run needs a build with --features nccl",
            ));
        }
        let device = CudaDevice::default();
        // Where a build without the repository's CubeCL patches falls back (README).
        println!("{}", burn_lowp::backend::cuda::active_paths(device.index));
        let client = CudaRuntime::client(&device);
        // The memory pool's reserved bytes: what the run holds on the GPU, read where the
        // training loop already synchronizes (loss reads).
        let probe = move || client.memory_usage().map(|u| u.bytes_reserved).unwrap_or(0);
        run::<Backend>(args, &device, Some(&probe)).map(|_| ())
    }
}

#[cfg(feature = "wgpu")]
mod wgpu {
    use burn::backend::Autodiff;
    use burn_cubecl::CubeBackend;
    use burn_lowp::error::LowpError;

    use crate::args::MoeTrainArgs;
    use crate::command::run;
    use burn_lowp_kernels::cubecl::wgpu::{WgpuDevice, WgpuRuntime};

    type Backend = Autodiff<CubeBackend<WgpuRuntime, f32, i32, u32>>;

    pub fn train(args: &MoeTrainArgs) -> Result<(), LowpError> {
        let device = WgpuDevice::default();
        run::<Backend>(args, &device, None).map(|_| ())
    }
}
