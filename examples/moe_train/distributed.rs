//! A rank of a multi-GPU run on CUDA (`--features nccl`): the process group joined after the run
//! config and recipes are read (their hashes must agree on every rank), then the command as a
//! data parallel rank (`parallel`), expert-parallel too when `train.expert_parallel_size` > 1
//! (the token exchange over the process group's expert-parallel communicator). A failure tells
//! the other ranks, which end at once.

use std::sync::Arc;

use burn_lowp::dist::{DifferentiableAllToAll, Fingerprint, GradReduceOptions, LaunchEnv, ProcessGroup, TensorAllReduce, TokenAllToAll};
use burn_lowp::ops::grad_tap::{GradientTap, ParamTap};
use burn_lowp::error::LowpError;
use burn_lowp_kernels::cubecl::cuda::{CudaDevice, CudaRuntime};
use burn_lowp_kernels::cubecl::Runtime;

use crate::args::MoeTrainArgs;
use crate::command::{load_config, load_recipes, run_parallel};
use crate::cuda::Backend;
use crate::parallel::{DataParallel, ExpertParallel, OverlapParts};

/// Trains as the rank `env` names (WORLD_SIZE above 1).
pub fn train(args: &MoeTrainArgs, env: LaunchEnv) -> Result<(), LowpError> {
    // Checked on every rank before any rank waits for another: a bad world size is the same
    // clear error everywhere.
    let config = load_config(args)?;
    config.train.check_world_size(env.world_size)?;
    let recipes = load_recipes(args)?;
    let recipes_json: Vec<String> = recipes.iter().map(|(name, r)| format!("{name}: {}", r.to_json())).collect();
    let fingerprints = [
        Fingerprint::of("run config", config.to_json().as_bytes()),
        Fingerprint::of("recipe", recipes_json.join("\n").as_bytes()),
    ];
    let group = ProcessGroup::init(env, &fingerprints, config.train.expert_parallel_size)?;
    let device = CudaDevice::new(group.device);
    let client = CudaRuntime::client(&device);
    let probe = move || client.memory_usage().map(|u| u.bytes_reserved).unwrap_or(0);
    let check = || group.check();
    type Inner = <Backend as burn::tensor::backend::AutodiffBackend>::InnerBackend;
    let exchange = DifferentiableAllToAll::<Inner>::new(Arc::new(group.expert_parallel.clone()));
    let expert_parallel = (group.layout.ep_size > 1).then(|| ExpertParallel {
        layout: group.layout,
        ep_rank: group.expert_parallel.rank(),
        exchange: &exchange as &dyn TokenAllToAll<Backend>,
        expert_reducer: &group.expert_data_parallel,
    });
    let make_tap = |sink| Arc::new(GradientTap::<Inner>::new(sink)) as Arc<dyn ParamTap<Backend>>;
    let overlap = config.train.overlap_grad_reduce.then(|| OverlapParts {
        world: Arc::new(group.world.clone()) as Arc<dyn TensorAllReduce<Inner> + Send + Sync>,
        experts: (group.layout.ep_size > 1)
            .then(|| Arc::new(group.expert_data_parallel.clone()) as Arc<dyn TensorAllReduce<Inner> + Send + Sync>),
        tap: &make_tap,
    });
    let parallel = DataParallel {
        rank: group.rank(),
        world_size: group.world_size(),
        reducer: &group.world,
        check: &check,
        grad_reduce: GradReduceOptions {
            in_fp32: config.train.grad_reduce_in_fp32,
            ..GradReduceOptions::default()
        },
        expert_parallel,
        overlap,
    };
    match run_parallel::<Backend>(args, &device, Some(&probe), Some(&parallel)) {
        Ok(_) => group.finish(),
        Err(e) => {
            group.fail(&e);
            Err(e)
        }
    }
}
