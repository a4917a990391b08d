//! Several GPUs: one process per GPU (a rank), NCCL between them.
//!
//! * `env`: the launch variables (torchrun's RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR,
//!   MASTER_PORT; LOWP_DIST_TIMEOUT), checked; none set is a one-GPU run;
//! * `launcher`: `--nproc-per-node N`, one host's ranks started by the program itself;
//! * `rendezvous`: the TCP handshake that checks the ranks agree and hands out NCCL's unique id;
//! * `liveness`: the rendezvous connections kept open, which notice a rank that dies;
//! * `fault`: a rank's first fault, the hooks it runs (abort NCCL, tell the others), the exit;
//! * `watchdog`: every queued collective watched until the GPU has passed it;
//! * `split`: expert-parallel arithmetic: groups, expert owners, all-to-all splits;
//! * `token_exchange`: the token all-to-all of expert parallelism on Burn tensors
//!   (`TokenAllToAll`, one host read of the counts per MoE layer), a one-rank loopback, and
//!   `all_to_all_op`, the exchange made differentiable (backward: the transposed exchange);
//! * `grad_reduce`: data parallelism's gradient averaging in buckets over flat buffers, written
//!   against `TensorAllReduce` (NCCL on CubeCL tensors: `tensor_collectives`);
//! * `overlapped_reduce`: the same reduction started as backward produces each weight's
//!   gradient (the layers' gradient tap, `ops::grad_tap`), joined after backward;
//! * `nccl_version`: the NCCL version rule (at least 2.18);
//! * behind the `nccl` feature: `nccl` (the communicator over cudarc's NCCL bindings),
//!   `collective_stream` (collectives on a stream of ours ordered against CubeCL's without a
//!   host wait), `collectives` (collectives on CubeCL buffers; `tensor_collectives` on Burn
//!   tensors: the gradient all-reduce and the token all-to-all), `group` (a rank's process group,
//!   put together from all of the above), `rank_program` (a program run as every rank: launch,
//!   join, work, finish or fail).
//!
//! docs/multi-gpu.md describes the design and what remains to wire.

pub mod all_to_all_op;
pub mod env;
pub mod fault;
pub mod grad_reduce;
pub mod launcher;
pub mod liveness;
pub mod nccl_version;
pub mod overlapped_reduce;
pub mod rendezvous;
pub mod split;
pub mod token_exchange;
pub mod watchdog;

#[cfg(feature = "nccl")]
pub mod collective_stream;
#[cfg(feature = "nccl")]
pub mod collectives;
#[cfg(feature = "nccl")]
pub mod group;
#[cfg(feature = "nccl")]
pub mod nccl;
#[cfg(feature = "nccl")]
pub mod rank_program;
#[cfg(feature = "nccl")]
pub mod tensor_collectives;

pub use env::LaunchEnv;
pub use fault::FaultState;
pub use overlapped_reduce::OverlappedGradReduce;
pub use grad_reduce::{reduce_gradients, reduce_gradients_in, GradReduceOptions, ReduceOp, ReduceScope, TensorAllReduce};
pub use rendezvous::Fingerprint;
pub use all_to_all_op::DifferentiableAllToAll;
pub use split::{invert_permutation, AllToAllSplits, ExpertSharding, GroupSource, ParallelLayout};
pub use token_exchange::{LoopbackAllToAll, TokenAllToAll};

#[cfg(feature = "nccl")]
pub use collectives::Collectives;
#[cfg(feature = "nccl")]
pub use group::ProcessGroup;
#[cfg(feature = "nccl")]
pub use nccl::ReduceDtype;
#[cfg(feature = "nccl")]
pub use rank_program::{run_rank_program, RankSetup};
