//! The multi-GPU foundation's CPU side (`burn_lowp::dist`): launch variables, the TCP rendezvous
//! and liveness channel over loopback (threads as ranks), the watchdog with fake events, the
//! expert-parallel arithmetic, the `--nproc-per-node` launcher with `/bin/sh` children, and data
//! parallel gradient averaging with threads as ranks, after backward and overlapped with it. No
//! GPU and no NCCL: what needs them runs on a GPU machine (docs/multi-gpu.md).

#[path = "dist/env.rs"]
mod env;

#[path = "dist/rendezvous.rs"]
mod rendezvous;

#[path = "dist/liveness.rs"]
mod liveness;

#[path = "dist/watchdog.rs"]
mod watchdog;

#[path = "dist/split.rs"]
mod split;

#[path = "dist/nccl_version.rs"]
mod nccl_version;

#[cfg(unix)]
#[path = "dist/launcher.rs"]
mod launcher;

#[path = "dist/grad_reduce.rs"]
mod grad_reduce;

#[path = "dist/overlapped_reduce.rs"]
mod overlapped_reduce;
