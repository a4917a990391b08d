//! The frame of a program that runs as every rank of a run (the `dist_smoke` and
//! `dist_bandwidth` examples): started with `--nproc-per-node N` it launches N copies of itself
//! (`launcher`) and waits for them; as one of those copies, or under torchrun, it joins the
//! process group, runs its work, and then finishes the group, or fails it so that the other
//! ranks end at once with its error instead of waiting for a collective it will not join.

use std::ffi::OsString;

use super::group::ProcessGroup;
use super::launcher::{launch, take_nproc_arg, LaunchOptions};
use super::rendezvous::Fingerprint;
use crate::error::{LowpError, Result};

/// What a rank program's arguments say: its options, the fingerprints every rank must agree on,
/// and the expert-parallel size its process group is laid out with.
pub struct RankSetup<O> {
    pub options: O,
    pub fingerprints: Vec<Fingerprint>,
    pub expert_parallel_size: usize,
}

/// Runs the program's `work` as one rank, or launches the ranks. `args` are the program's
/// arguments (without the program name); `parse` reads them without `--nproc-per-node`, once
/// before any rank starts, so that a bad argument is one error, not one per rank.
pub fn run_rank_program<O>(
    args: &[OsString],
    parse: impl Fn(&[OsString]) -> Result<RankSetup<O>>,
    work: impl FnOnce(&ProcessGroup, O) -> Result<()>,
) -> Result<()> {
    let (nproc, rest) = take_nproc_arg(args)?;
    let setup = parse(&rest)?;
    if let Some(n) = nproc {
        return launch(&LaunchOptions::current_exe(n, rest)?);
    }
    let group = ProcessGroup::from_env(&setup.fingerprints, setup.expert_parallel_size)?.ok_or_else(|| {
        LowpError::invalid("WORLD_SIZE", "unset", "run with --nproc-per-node N or under torchrun")
    })?;
    match work(&group, setup.options) {
        Ok(()) => group.finish(),
        Err(e) => {
            group.fail(&e);
            Err(e)
        }
    }
}
