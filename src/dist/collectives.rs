//! Collectives on CubeCL buffers: a communicator and the stream its work is ordered on.
//!
//! What the training loop and the MoE layer call. Sizes are checked on the host before anything
//! is queued; the call returns once the collective is handed to CubeCL's device thread, without
//! waiting for it, and the buffers' later readers (CubeCL kernels, reads to the host) run after
//! it. Every rank of the communicator must issue the same collectives in the same order.

use std::sync::Arc;

use burn_lowp_kernels::cubecl::server::Handle;

use super::collective_stream::{CollectiveStream, CollectiveWork};
use super::grad_reduce::ReduceOp;
use super::nccl::{Communicator, ReduceDtype};
use crate::error::{LowpError, Result};

#[derive(Clone)]
pub struct Collectives {
    comm: Communicator,
    stream: Arc<dyn CollectiveStream>,
}

impl std::fmt::Debug for Collectives {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Collectives")
            .field("communicator", &self.comm.name())
            .field("rank", &self.rank())
            .field("size", &self.size())
            .finish()
    }
}

impl Collectives {
    pub fn new(comm: Communicator, stream: Arc<dyn CollectiveStream>) -> Collectives {
        Collectives { comm, stream }
    }

    pub fn comm(&self) -> &Communicator {
        &self.comm
    }

    pub fn rank(&self) -> usize {
        self.comm.rank()
    }

    pub fn size(&self) -> usize {
        self.comm.size()
    }

    /// All-reduce of `count` elements of `dtype` from `send` into `recv`; pass one handle twice
    /// for in place (only where nothing else reads it: `Handle::can_mut`). Gradient buckets in
    /// BF16 or FP32 (`ReduceOp::Sum` or `Avg`), the delayed-scaling amaxes in one FP32 buffer
    /// (`ReduceOp::Max`), the step's metrics.
    pub fn all_reduce(&self, send: &Handle, recv: &Handle, count: usize, dtype: ReduceDtype, op: ReduceOp) -> Result<()> {
        self.queue_all_reduce(send, recv, count, dtype, op, true)
    }

    /// `all_reduce` that leaves CubeCL's stream free to go on (`CollectiveStream::submit_unjoined`):
    /// `recv` must not be used on CubeCL before `join`.
    pub fn all_reduce_unjoined(&self, send: &Handle, recv: &Handle, count: usize, dtype: ReduceDtype, op: ReduceOp) -> Result<()> {
        self.queue_all_reduce(send, recv, count, dtype, op, false)
    }

    /// The all-reduce's checks and queueing, ordered before CubeCL's next work (`joined`) or not.
    fn queue_all_reduce(
        &self,
        send: &Handle,
        recv: &Handle,
        count: usize,
        dtype: ReduceDtype,
        op: ReduceOp,
        joined: bool,
    ) -> Result<()> {
        let bytes = count
            .checked_mul(dtype.size())
            .ok_or_else(|| LowpError::invalid("all-reduce count", count, "overflows"))?;
        check_holds("all-reduce input", send, bytes)?;
        check_holds("all-reduce output", recv, bytes)?;
        let comm = self.comm.clone();
        let buffers = vec![send.clone(), recv.clone()];
        let work: CollectiveWork =
            Box::new(move |stream, ptrs| unsafe { comm.all_reduce(stream, ptrs[0], ptrs[1], count, dtype, op) });
        if joined {
            self.stream.submit(buffers, work)
        } else {
            self.stream.submit_unjoined(buffers, work)
        }
    }

    /// Orders the calling thread's next CubeCL work after every collective queued on this
    /// stream so far (the unjoined ones included). Does not wait.
    pub fn join(&self) -> Result<()> {
        self.stream.join()
    }

    /// All-gather of `bytes_per_rank` bytes from every rank into `recv`, in rank order: the
    /// token counts per expert before a dispatch (`AllToAllSplits::dispatch` takes the result).
    pub fn all_gather(&self, send: &Handle, recv: &Handle, bytes_per_rank: usize) -> Result<()> {
        check_holds("all-gather input", send, bytes_per_rank)?;
        let total = bytes_per_rank
            .checked_mul(self.size())
            .ok_or_else(|| LowpError::invalid("all-gather bytes", bytes_per_rank, "overflow"))?;
        check_holds("all-gather output", recv, total)?;
        let comm = self.comm.clone();
        self.stream.submit(
            vec![send.clone(), recv.clone()],
            Box::new(move |stream, ptrs| unsafe { comm.all_gather(stream, ptrs[0], ptrs[1], bytes_per_rank) }),
        )
    }

    /// All-to-all with uneven splits in bytes (`AllToAllSplits::bytes` of the row splits):
    /// blocks of `send` in rank order go to the ranks, blocks from the ranks land in `recv` in
    /// rank order. The token dispatch and combine of expert parallelism, and their backward with
    /// the splits swapped (`AllToAllSplits::transposed`).
    pub fn all_to_all(&self, send: &Handle, send_bytes: Vec<usize>, recv: &Handle, recv_bytes: Vec<usize>) -> Result<()> {
        check_holds("all-to-all input", send, send_bytes.iter().sum())?;
        check_holds("all-to-all output", recv, recv_bytes.iter().sum())?;
        if send_bytes.len() != self.size() || recv_bytes.len() != self.size() {
            return Err(LowpError::invalid(
                "all-to-all splits",
                format!("{} send and {} receive", send_bytes.len(), recv_bytes.len()),
                format!("must be one per rank of the {} communicator ({})", self.comm.name(), self.size()),
            ));
        }
        let comm = self.comm.clone();
        self.stream.submit(
            vec![send.clone(), recv.clone()],
            Box::new(move |stream, ptrs| unsafe { comm.all_to_all(stream, ptrs[0], &send_bytes, ptrs[1], &recv_bytes) }),
        )
    }
}

fn check_holds(what: &str, handle: &Handle, bytes: usize) -> Result<()> {
    let held = handle.size_in_used();
    if (held as u128) < bytes as u128 {
        return Err(LowpError::invalid(
            what,
            format!("a buffer of {held} bytes"),
            format!("must hold the {bytes} bytes the collective moves"),
        ));
    }
    Ok(())
}
