//! Expert-parallel arithmetic: how ranks form groups, which rank owns which expert, and the
//! split counts of the token all-to-all. Plain integers, checked, no GPU.
//!
//! Groups follow Megatron-Core's default order (expert parallel inside data parallel): the
//! `world / ep` expert-parallel groups are runs of consecutive ranks (`0..ep`, `ep..2ep`, ...),
//! so that one group sits on one host's NVLink where it can; the ranks holding the same experts
//! (equal `ep_rank`, one per EP group) form an expert-data-parallel group, which all-reduces the
//! expert gradients. Dense parameters (attention, router, norms, embeddings) are replicated on
//! every rank and all-reduced over the whole world.
//!
//! Experts are sharded in contiguous blocks: EP rank `r` owns experts
//! `r * experts_per_rank .. (r + 1) * experts_per_rank`. Tokens leave a rank sorted by global
//! expert, so the tokens for one destination are contiguous and arrive ordered by source rank,
//! then by local expert (`AllToAllSplits`).

use std::ops::Range;

use crate::error::{LowpError, Result};

/// Where one of a rank's group communicators comes from. Every group that is neither the world
/// nor a single rank is made from its own unique id, not split from the world: `ncclCommSplit`
/// on a non-blocking world first returned no communicator (NCCL 2.28, 2 x H200, 2026-11-27) and,
/// once waited for, aborted 4-rank runs in glibc at start-up (4 x H100, 2026-11-28); the path
/// through `ncclCommInitRankConfig` is the world's own, so every group takes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GroupSource {
    /// The group is the whole world: its communicator is the world's.
    World,
    /// The group is this rank alone: a communicator of one, from an id the rank makes itself.
    Alone,
    /// A communicator of `size` ranks from rank 0's unique id number `id_index`, in which this
    /// rank is `rank`.
    Own { id_index: usize, size: usize, rank: usize },
}

/// How `world_size` ranks divide into expert-parallel and data-parallel groups.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ParallelLayout {
    pub world_size: usize,
    /// Ranks per expert-parallel group (`expert_parallel_size`).
    pub ep_size: usize,
    /// Expert-parallel groups; also the size of each expert-data-parallel group.
    pub ep_groups: usize,
}

impl ParallelLayout {
    pub fn new(world_size: usize, ep_size: usize) -> Result<ParallelLayout> {
        if world_size == 0 {
            return Err(LowpError::invalid("world size", 0, "must be at least 1"));
        }
        if ep_size == 0 || world_size % ep_size != 0 {
            return Err(LowpError::invalid(
                "expert_parallel_size",
                ep_size,
                format!("must be at least 1 and divide the world size {world_size}"),
            ));
        }
        Ok(ParallelLayout {
            world_size,
            ep_size,
            ep_groups: world_size / ep_size,
        })
    }

    fn check_rank(&self, rank: usize) -> Result<()> {
        if rank >= self.world_size {
            return Err(LowpError::invalid(
                "rank",
                rank,
                format!("must be below the world size {}", self.world_size),
            ));
        }
        Ok(())
    }

    /// This rank's index inside its expert-parallel group (which experts it holds).
    pub fn ep_rank(&self, rank: usize) -> Result<usize> {
        self.check_rank(rank)?;
        Ok(rank % self.ep_size)
    }

    /// Which expert-parallel group the rank is in; also its rank in its expert-data-parallel
    /// group.
    pub fn ep_group(&self, rank: usize) -> Result<usize> {
        self.check_rank(rank)?;
        Ok(rank / self.ep_size)
    }

    /// The world ranks of `rank`'s expert-parallel group (the all-to-all's peers, in EP-rank
    /// order).
    pub fn ep_group_ranks(&self, rank: usize) -> Result<Range<usize>> {
        let group = self.ep_group(rank)?;
        Ok(group * self.ep_size..(group + 1) * self.ep_size)
    }

    /// The world ranks holding the same experts as `rank` (its expert gradients' all-reduce).
    pub fn expert_dp_ranks(&self, rank: usize) -> Result<Vec<usize>> {
        let ep_rank = self.ep_rank(rank)?;
        Ok((0..self.ep_groups).map(|g| g * self.ep_size + ep_rank).collect())
    }

    /// How many NCCL unique ids rank 0 makes and hands out in the rendezvous: the world's, then
    /// (when the groups are neither the world nor single ranks) one per expert-parallel group
    /// and one per expert-data-parallel group (`GroupSource::Own`'s `id_index`).
    pub fn unique_ids(&self) -> usize {
        if self.ep_size > 1 && self.ep_groups > 1 {
            1 + self.ep_groups + self.ep_size
        } else {
            1
        }
    }

    /// Where `rank`'s expert-parallel communicator comes from.
    pub fn ep_source(&self, rank: usize) -> Result<GroupSource> {
        let (group, ep_rank) = (self.ep_group(rank)?, self.ep_rank(rank)?);
        Ok(self.source(self.ep_size, 1 + group, ep_rank))
    }

    /// Where `rank`'s expert-data-parallel communicator comes from.
    pub fn expert_dp_source(&self, rank: usize) -> Result<GroupSource> {
        let (group, ep_rank) = (self.ep_group(rank)?, self.ep_rank(rank)?);
        Ok(self.source(self.ep_groups, 1 + self.ep_groups + ep_rank, group))
    }

    fn source(&self, size: usize, id_index: usize, rank: usize) -> GroupSource {
        if size == self.world_size {
            GroupSource::World
        } else if size == 1 {
            GroupSource::Alone
        } else {
            GroupSource::Own { id_index, size, rank }
        }
    }

    /// What every gradient sum is divided by to give the mean over the global batch: the world
    /// size, for expert gradients too. An expert's gradient already sums the tokens of its
    /// whole EP group (they came through the all-to-all), and the expert-DP all-reduce adds the
    /// other groups', so the sum covers every rank's batch, as a dense gradient's does: dividing
    /// it by the expert-DP group's size would scale experts by `ep_size` too much.
    pub fn grad_divisor(&self) -> usize {
        self.world_size
    }
}

/// Which EP rank holds which experts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExpertSharding {
    pub num_experts: usize,
    pub ep_size: usize,
    pub experts_per_rank: usize,
}

impl ExpertSharding {
    pub fn new(num_experts: usize, ep_size: usize) -> Result<ExpertSharding> {
        if ep_size == 0 {
            return Err(LowpError::invalid("expert_parallel_size", 0, "must be at least 1"));
        }
        if num_experts == 0 || num_experts % ep_size != 0 {
            return Err(LowpError::invalid(
                "num_experts",
                num_experts,
                format!("must be a positive multiple of expert_parallel_size = {ep_size} (each EP rank holds an equal share)"),
            ));
        }
        Ok(ExpertSharding {
            num_experts,
            ep_size,
            experts_per_rank: num_experts / ep_size,
        })
    }

    /// The EP rank that holds global expert `expert`.
    pub fn owner(&self, expert: usize) -> Result<usize> {
        if expert >= self.num_experts {
            return Err(LowpError::invalid(
                "expert",
                expert,
                format!("must be below num_experts = {}", self.num_experts),
            ));
        }
        Ok(expert / self.experts_per_rank)
    }

    /// The global experts EP rank `ep_rank` holds.
    pub fn local_experts(&self, ep_rank: usize) -> Result<Range<usize>> {
        if ep_rank >= self.ep_size {
            return Err(LowpError::invalid(
                "EP rank",
                ep_rank,
                format!("must be below expert_parallel_size = {}", self.ep_size),
            ));
        }
        Ok(ep_rank * self.experts_per_rank..(ep_rank + 1) * self.experts_per_rank)
    }
}

/// The splits of one all-to-all over an EP group, in tokens (rows); multiply by a row's bytes
/// for the byte counts NCCL takes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AllToAllSplits {
    /// Rows this rank sends to each EP rank, in EP-rank order.
    pub send: Vec<usize>,
    /// Rows this rank receives from each EP rank.
    pub recv: Vec<usize>,
    /// `per_expert[peer][j]`: rows exchanged with EP rank `peer` for this rank's local expert
    /// `j`, on the experts' side: the dispatch's receive buffer holds them in this order
    /// (peer-major), and so does the combine's send buffer (`transposed` keeps it).
    pub per_expert: Vec<Vec<usize>>,
}

impl AllToAllSplits {
    /// The token dispatch of EP rank `ep_rank`, from every EP rank's token count per global
    /// expert: `counts[r * num_experts + e]`, rank `r`'s tokens routed to expert `e` (what an
    /// all-gather of each rank's per-expert counts gives every rank).
    pub fn dispatch(sharding: &ExpertSharding, ep_rank: usize, counts: &[usize]) -> Result<AllToAllSplits> {
        let (n, ep) = (sharding.num_experts, sharding.ep_size);
        if counts.len() != n * ep {
            return Err(LowpError::shape(
                "all-to-all token counts",
                counts.len(),
                format!("must hold expert_parallel_size x num_experts = {ep} x {n} counts"),
            ));
        }
        let local = sharding.local_experts(ep_rank)?;
        let mine = &counts[ep_rank * n..(ep_rank + 1) * n];
        let send = (0..ep)
            .map(|dst| mine[sharding.local_experts(dst).expect("dst < ep")].iter().sum())
            .collect();
        let per_expert: Vec<Vec<usize>> = (0..ep)
            .map(|src| counts[src * n + local.start..src * n + local.end].to_vec())
            .collect();
        let recv = per_expert.iter().map(|row| row.iter().sum()).collect();
        Ok(AllToAllSplits {
            send,
            recv,
            per_expert,
        })
    }

    /// The reverse all-to-all: the combine after the experts, and the backward of this one
    /// (gradients travel back along the same rows). Sends what was received and receives what
    /// was sent.
    pub fn transposed(&self) -> AllToAllSplits {
        AllToAllSplits {
            send: self.recv.clone(),
            recv: self.send.clone(),
            per_expert: self.per_expert.clone(),
        }
    }

    /// Start row of each peer's block in the send buffer.
    pub fn send_offsets(&self) -> Vec<usize> {
        prefix_sums(&self.send)
    }

    /// Start row of each peer's block in the receive buffer.
    pub fn recv_offsets(&self) -> Vec<usize> {
        prefix_sums(&self.recv)
    }

    /// Rows per local expert once received (the grouped GEMM's group sizes).
    pub fn tokens_per_local_expert(&self) -> Vec<usize> {
        let experts = self.per_expert.first().map_or(0, Vec::len);
        (0..experts).map(|j| self.per_expert.iter().map(|row| row[j]).sum()).collect()
    }

    /// The received rows regrouped by local expert (Megatron's `sort_chunks_by_idxs`): the chunk
    /// sizes as received (source-major) and, in expert-major order, the index of each chunk to
    /// take. Applying the inverse order before the combine restores source-major rows.
    pub fn expert_major_order(&self) -> (Vec<usize>, Vec<usize>) {
        let sources = self.per_expert.len();
        let experts = self.per_expert.first().map_or(0, Vec::len);
        let sizes = self.per_expert.iter().flatten().copied().collect();
        let order = (0..experts)
            .flat_map(|j| (0..sources).map(move |src| src * experts + j))
            .collect();
        (sizes, order)
    }

    /// The row permutation behind `expert_major_order`: `rows[i]` is the received row (source
    /// rank major, then local expert) that lands at row `i` of the local-expert-major batch the
    /// grouped GEMMs take. A gather by it regroups the dispatch's rows; a gather by its inverse
    /// (`invert_permutation`) restores the received order before the combine.
    pub fn expert_major_rows(&self) -> Vec<usize> {
        let (sizes, order) = self.expert_major_order();
        let starts = prefix_sums(&sizes);
        order
            .into_iter()
            .flat_map(|chunk| starts[chunk]..starts[chunk] + sizes[chunk])
            .collect()
    }

    /// Bytes per peer for rows of `row_bytes` bytes, checked against overflow.
    pub fn bytes(rows: &[usize], row_bytes: usize) -> Result<Vec<usize>> {
        rows.iter()
            .map(|&r| {
                r.checked_mul(row_bytes).ok_or_else(|| {
                    LowpError::invalid("all-to-all split", format!("{r} rows x {row_bytes} bytes"), "overflows")
                })
            })
            .collect()
    }
}

fn prefix_sums(sizes: &[usize]) -> Vec<usize> {
    sizes
        .iter()
        .scan(0, |acc, &s| {
            let start = *acc;
            *acc += s;
            Some(start)
        })
        .collect()
}

/// The inverse of a permutation of `0..n`: `inverse[perm[i]] = i`. `Err` if `perm` is not one
/// (a repeated or out-of-range index).
pub fn invert_permutation(perm: &[usize]) -> Result<Vec<usize>> {
    let mut inverse = vec![usize::MAX; perm.len()];
    for (i, &p) in perm.iter().enumerate() {
        match inverse.get_mut(p) {
            Some(slot) if *slot == usize::MAX => *slot = i,
            _ => return Err(LowpError::invalid("row permutation", p, format!("must name each of 0..{} once", perm.len()))),
        }
    }
    Ok(inverse)
}
