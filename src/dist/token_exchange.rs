//! The token exchange of expert parallelism on Burn tensors: what an MoE layer calls to send
//! each token row to the EP rank that holds its expert and to bring the expert outputs back.
//!
//! Two calls per direction (Megatron-Core's "alltoall" token dispatcher):
//! * `gather_counts`: every EP rank's token count per global expert, `[ep_size * E]`, read on
//!   the host. The all-to-all's split sizes are host arguments of NCCL, and the grouped GEMMs'
//!   local layout needs the received counts, so one host read per MoE layer and forward is
//!   unavoidable here; Megatron-Core (`MoEAlltoAllTokenDispatcher`, the `.cpu()` of its
//!   `input_splits` / `output_splits`) and torchtitan make the same synchronisation.
//! * `all_to_all`: rows `[n, hidden]` in blocks of `send[peer]` rows, one block to each EP rank
//!   in rank order; returns the `recv[peer]` rows from each, in rank order.
//!
//! Implementations: `Collectives` on CubeCL's CUDA runtime (NCCL, `tensor_collectives`), the
//! one-rank `LoopbackAllToAll` here (the EP code path on one device, for tests), anything a test
//! puts between threads. `DifferentiableAllToAll` (`all_to_all_op`) makes an implementation on a
//! backend differentiable on `Autodiff` of it: the backward of an all-to-all is the all-to-all of
//! the gradient with the splits swapped (`AllToAllSplits::transposed`).

use std::fmt::Debug;

use burn::tensor::backend::Backend;
use burn::tensor::{Int, Tensor};

use crate::error::{LowpError, Result};

/// Rows exchanged between the ranks of one expert-parallel group. Every rank of the group must
/// make the same calls in the same order (the collectives underneath are matched by order).
pub trait TokenAllToAll<B: Backend>: Send + Sync + Debug {
    /// This rank's index in its EP group (which block of experts it holds).
    fn ep_rank(&self) -> usize;

    /// Ranks of the EP group.
    fn ep_size(&self) -> usize;

    /// All-gather of each EP rank's `counts [E]` (tokens per global expert), read on the host:
    /// `[ep_size * E]`, rank-major, what `AllToAllSplits::dispatch` takes. One host read.
    fn gather_counts(&self, counts: Tensor<B, 1, Int>) -> Result<Vec<usize>>;

    /// All-to-all of `rows [sum(send), hidden]`: `send[p]` rows to EP rank `p`, `recv[p]` rows
    /// from it; returns `[sum(recv), hidden]`, blocks in rank order.
    fn all_to_all(&self, rows: Tensor<B, 2>, send: &[usize], recv: &[usize]) -> Result<Tensor<B, 2>>;
}

/// Checks the splits against the rows and the group before anything is queued.
pub fn check_splits(rows: usize, send: &[usize], recv: &[usize], ep_size: usize) -> Result<()> {
    if send.len() != ep_size || recv.len() != ep_size {
        return Err(LowpError::invalid(
            "token all-to-all splits",
            format!("{} send and {} receive", send.len(), recv.len()),
            format!("must be one per rank of the expert-parallel group ({ep_size})"),
        ));
    }
    let sent: usize = send.iter().sum();
    if sent != rows {
        return Err(LowpError::shape(
            "token all-to-all rows",
            rows,
            format!("must equal the rows the send splits name ({sent})"),
        ));
    }
    Ok(())
}

/// Host values of an int tensor of counts (the host read).
pub fn host_counts<B: Backend>(counts: Tensor<B, 1, Int>) -> Result<Vec<usize>> {
    let values = counts
        .into_data()
        .convert::<i64>()
        .into_vec::<i64>()
        .map_err(|e| LowpError::invalid("token counts", format!("{e:?}"), "must be readable as integers"))?;
    values
        .into_iter()
        .map(|c| usize::try_from(c).map_err(|_| LowpError::invalid("token count", c, "must not be negative")))
        .collect()
}

/// The exchange of a one-rank EP group: every row stays. Runs the expert-parallel code path on
/// one device (its results equal the plain layer's), for tests and for checking the path.
#[derive(Debug, Clone, Copy, Default)]
pub struct LoopbackAllToAll;

impl<B: Backend> TokenAllToAll<B> for LoopbackAllToAll {
    fn ep_rank(&self) -> usize {
        0
    }

    fn ep_size(&self) -> usize {
        1
    }

    fn gather_counts(&self, counts: Tensor<B, 1, Int>) -> Result<Vec<usize>> {
        host_counts(counts)
    }

    fn all_to_all(&self, rows: Tensor<B, 2>, send: &[usize], recv: &[usize]) -> Result<Tensor<B, 2>> {
        check_splits(rows.dims()[0], send, recv, 1)?;
        if send != recv {
            return Err(LowpError::invalid(
                "loopback all-to-all splits",
                format!("send {send:?}, receive {recv:?}"),
                "must be equal: one rank receives what it sends",
            ));
        }
        Ok(rows)
    }
}
