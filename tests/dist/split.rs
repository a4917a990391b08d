//! Expert-parallel arithmetic against hand-computed cases.

use burn_lowp::dist::split::{invert_permutation, GroupSource};
use burn_lowp::dist::{AllToAllSplits, ExpertSharding, ParallelLayout};

#[test]
fn groups_are_consecutive_for_ep_and_strided_for_expert_dp() {
    let layout = ParallelLayout::new(8, 4).unwrap();
    assert_eq!(layout.ep_groups, 2);
    assert_eq!(layout.ep_group_ranks(5).unwrap(), 4..8);
    assert_eq!(layout.ep_rank(5).unwrap(), 1);
    assert_eq!(layout.ep_group(5).unwrap(), 1);
    assert_eq!(layout.expert_dp_ranks(5).unwrap(), vec![1, 5]);
    // Rank 0 makes the world's id, then one per EP group (2), then one per expert-DP group (4).
    assert_eq!(layout.unique_ids(), 1 + 2 + 4);
    assert_eq!(layout.ep_source(6).unwrap(), GroupSource::Own { id_index: 2, size: 4, rank: 2 });
    assert_eq!(layout.expert_dp_source(6).unwrap(), GroupSource::Own { id_index: 5, size: 2, rank: 1 });
    assert_eq!(layout.ep_source(1).unwrap(), GroupSource::Own { id_index: 1, size: 4, rank: 1 });
    assert_eq!(layout.expert_dp_source(1).unwrap(), GroupSource::Own { id_index: 4, size: 2, rank: 0 });
    assert_eq!(layout.grad_divisor(), 8);
    // EP = 1 is plain data parallelism; EP = world has one EP group and no expert replicas.
    // Their groups are the world or single ranks: no id beyond the world's.
    let dp = ParallelLayout::new(4, 1).unwrap();
    assert_eq!(dp.expert_dp_ranks(2).unwrap(), vec![0, 1, 2, 3]);
    assert_eq!(dp.unique_ids(), 1);
    assert_eq!(dp.ep_source(2).unwrap(), GroupSource::Alone);
    assert_eq!(dp.expert_dp_source(2).unwrap(), GroupSource::World);
    let ep = ParallelLayout::new(4, 4).unwrap();
    assert_eq!(ep.expert_dp_ranks(2).unwrap(), vec![2]);
    assert_eq!(ep.unique_ids(), 1);
    assert_eq!(ep.ep_source(2).unwrap(), GroupSource::World);
    assert_eq!(ep.expert_dp_source(2).unwrap(), GroupSource::Alone);
}

#[test]
fn layouts_that_do_not_divide_are_refused() {
    let e = ParallelLayout::new(6, 4).unwrap_err().to_string();
    assert!(e.starts_with("expert_parallel_size = 4") && e.contains("divide the world size 6"), "{e}");
    assert!(ParallelLayout::new(4, 0).is_err());
    assert!(ParallelLayout::new(0, 1).is_err());
    let e = ParallelLayout::new(4, 2).unwrap().ep_rank(4).unwrap_err().to_string();
    assert!(e.contains("below the world size 4"), "{e}");
}

#[test]
fn experts_are_sharded_in_blocks() {
    let s = ExpertSharding::new(8, 4).unwrap();
    assert_eq!(s.experts_per_rank, 2);
    assert_eq!(s.owner(5).unwrap(), 2);
    assert_eq!(s.owner(0).unwrap(), 0);
    assert_eq!(s.local_experts(3).unwrap(), 6..8);
    let e = ExpertSharding::new(6, 4).unwrap_err().to_string();
    assert!(e.starts_with("num_experts = 6") && e.contains("multiple of expert_parallel_size = 4"), "{e}");
    assert!(s.owner(8).is_err());
    assert!(s.local_experts(4).is_err());
    assert!(ExpertSharding::new(0, 1).is_err());
}

/// 4 experts over 2 EP ranks. Rank 0 routes [3, 0, 2, 5] tokens to experts 0..4, rank 1
/// [1, 4, 0, 0] (expert 2 and 3 get nothing from it: empty blocks).
const COUNTS: [usize; 8] = [3, 0, 2, 5, 1, 4, 0, 0];

#[test]
fn dispatch_splits_by_hand() {
    let s = ExpertSharding::new(4, 2).unwrap();
    let r0 = AllToAllSplits::dispatch(&s, 0, &COUNTS).unwrap();
    assert_eq!(r0.send, vec![3, 7]);
    assert_eq!(r0.recv, vec![3, 5]);
    assert_eq!(r0.per_expert, vec![vec![3, 0], vec![1, 4]]);
    assert_eq!(r0.tokens_per_local_expert(), vec![4, 4]);
    assert_eq!(r0.send_offsets(), vec![0, 3]);
    assert_eq!(r0.recv_offsets(), vec![0, 3]);
    assert_eq!(r0.expert_major_order(), (vec![3, 0, 1, 4], vec![0, 2, 1, 3]));

    let r1 = AllToAllSplits::dispatch(&s, 1, &COUNTS).unwrap();
    assert_eq!(r1.send, vec![5, 0]);
    assert_eq!(r1.recv, vec![7, 0]);
    assert_eq!(r1.per_expert, vec![vec![2, 5], vec![0, 0]]);
    assert_eq!(r1.tokens_per_local_expert(), vec![2, 5]);
    assert_eq!(r1.recv_offsets(), vec![0, 7]);

    // The combine (and the dispatch's backward) swaps the directions.
    let back = r1.transposed();
    assert_eq!((back.send, back.recv), (vec![7, 0], vec![5, 0]));
    assert_eq!(AllToAllSplits::bytes(&r0.send, 512).unwrap(), vec![1536, 3584]);
    assert!(AllToAllSplits::bytes(&[usize::MAX], 2).is_err());
}

#[test]
fn what_one_rank_sends_is_what_its_peer_receives() {
    // 3 EP ranks, 6 experts, counts from a fixed pseudo-random sequence with zeros.
    let s = ExpertSharding::new(6, 3).unwrap();
    let counts: Vec<usize> = (0..18u64).map(|i| ((i * 2654435761) % 7) as usize).collect();
    let splits: Vec<_> = (0..3).map(|r| AllToAllSplits::dispatch(&s, r, &counts).unwrap()).collect();
    for src in 0..3 {
        for dst in 0..3 {
            assert_eq!(splits[src].send[dst], splits[dst].recv[src], "{src} -> {dst}");
        }
        let routed: usize = counts[src * 6..(src + 1) * 6].iter().sum();
        assert_eq!(splits[src].send.iter().sum::<usize>(), routed);
    }
    let total: usize = counts.iter().sum();
    assert_eq!(splits.iter().flat_map(|s| s.tokens_per_local_expert()).sum::<usize>(), total);
}

#[test]
fn wrong_count_tables_are_refused() {
    let s = ExpertSharding::new(4, 2).unwrap();
    let e = AllToAllSplits::dispatch(&s, 0, &COUNTS[..6]).unwrap_err().to_string();
    assert!(e.contains("2 x 4 counts"), "{e}");
    assert!(AllToAllSplits::dispatch(&s, 2, &COUNTS).is_err());
}

#[test]
fn received_rows_regroup_by_local_expert_and_back() {
    // 4 experts over 2 EP ranks: rank 0 routes [1, 0, 2, 1], rank 1 [0, 0, 1, 2]. EP rank 1
    // (experts 2 and 3) receives, in order: rank 0's 2 rows for expert 2 (rows 0, 1) and 1 for
    // expert 3 (row 2), then rank 1's 1 row for expert 2 (row 3) and 2 for expert 3 (rows 4, 5).
    let s = ExpertSharding::new(4, 2).unwrap();
    let counts = [1, 0, 2, 1, 0, 0, 1, 2];
    let r1 = AllToAllSplits::dispatch(&s, 1, &counts).unwrap();
    assert_eq!(r1.per_expert, vec![vec![2, 1], vec![1, 2]]);
    let rows = r1.expert_major_rows();
    // Expert 2: rows 0, 1, 3; expert 3: rows 2, 4, 5.
    assert_eq!(rows, vec![0, 1, 3, 2, 4, 5]);
    assert_eq!(invert_permutation(&rows).unwrap(), vec![0, 1, 3, 2, 4, 5]);
    // Where nothing interleaves (one source, or one expert a rank), the order is the identity.
    let r0 = AllToAllSplits::dispatch(&s, 0, &COUNTS).unwrap();
    assert_eq!(r0.expert_major_rows(), (0..8).collect::<Vec<_>>());
}

#[test]
fn the_expert_major_permutation_is_a_bijection() {
    // 3 EP ranks, 9 experts, pseudo-random counts with zeros: every rank's permutation names
    // each received row once, and gathering by it then by its inverse gives the rows back.
    let s = ExpertSharding::new(9, 3).unwrap();
    let counts: Vec<usize> = (0..27u64).map(|i| ((i * 2654435761) % 5) as usize).collect();
    for r in 0..3 {
        let splits = AllToAllSplits::dispatch(&s, r, &counts).unwrap();
        let rows = splits.expert_major_rows();
        let received: usize = splits.recv.iter().sum();
        assert_eq!(rows.len(), received);
        let inverse = invert_permutation(&rows).unwrap();
        let regrouped: Vec<usize> = rows.iter().map(|&i| i * 10).collect();
        let restored: Vec<usize> = inverse.iter().map(|&i| regrouped[i]).collect();
        assert_eq!(restored, (0..received).map(|i| i * 10).collect::<Vec<_>>());
        // Each local expert's rows are contiguous and as many as it was sent.
        let mut start = 0;
        for (j, n) in splits.tokens_per_local_expert().into_iter().enumerate() {
            let mut mine: Vec<usize> = rows[start..start + n].to_vec();
            mine.sort();
            let expected: Vec<usize> = (0..3)
                .flat_map(|src| {
                    let off = splits.recv_offsets()[src] + splits.per_expert[src][..j].iter().sum::<usize>();
                    off..off + splits.per_expert[src][j]
                })
                .collect();
            assert_eq!(mine, expected, "rank {r} expert {j}");
            start += n;
        }
    }
    assert!(invert_permutation(&[0, 0]).is_err());
    assert!(invert_permutation(&[2, 0]).is_err());
}

/// Over every layout of up to 8 ranks: the ranks that join one of rank 0's ids are exactly the
/// members of one group (`ep_group_ranks`, `expert_dp_ranks`), seated 0..size in order, and every
/// id rank 0 makes is joined.
#[test]
fn every_group_id_is_joined_by_exactly_its_members() {
    use std::collections::BTreeMap;
    for world in 1..=8usize {
        for ep in (1..=world).filter(|ep| world % ep == 0) {
            let layout = ParallelLayout::new(world, ep).unwrap();
            let mut seats: BTreeMap<usize, Vec<(usize, usize, usize)>> = BTreeMap::new();
            for rank in 0..world {
                let members = [layout.ep_group_ranks(rank).unwrap().collect::<Vec<_>>(), layout.expert_dp_ranks(rank).unwrap()];
                let sources = [layout.ep_source(rank).unwrap(), layout.expert_dp_source(rank).unwrap()];
                for (source, members) in sources.into_iter().zip(members) {
                    match source {
                        GroupSource::World => assert_eq!(members.len(), world, "{world}/{ep} rank {rank}"),
                        GroupSource::Alone => assert_eq!(members, vec![rank], "{world}/{ep} rank {rank}"),
                        GroupSource::Own { id_index, size, rank: seat } => {
                            assert_eq!(members.len(), size, "{world}/{ep} rank {rank}");
                            assert_eq!(members[seat], rank, "{world}/{ep} rank {rank}");
                            seats.entry(id_index).or_default().push((seat, rank, size));
                        }
                    }
                }
            }
            let joined: Vec<usize> = seats.keys().copied().collect();
            assert_eq!(joined, (1..layout.unique_ids()).collect::<Vec<_>>(), "{world}/{ep}");
            for (id, mut seated) in seats {
                seated.sort();
                let size = seated[0].2;
                assert_eq!(seated.iter().map(|s| s.0).collect::<Vec<_>>(), (0..size).collect::<Vec<_>>(), "{world}/{ep} id {id}");
            }
        }
    }
}
