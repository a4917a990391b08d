//! The liveness channel: a rank that dies or fails is noticed by every other rank, at once; a
//! clean finish is no fault.

use std::sync::Arc;
use std::time::{Duration, Instant};

use burn_lowp::dist::liveness::{Liveness, LivenessTiming};
use burn_lowp::dist::FaultState;

use super::rendezvous::run_ranks;

const TIMING: LivenessTiming = LivenessTiming {
    heartbeat: Duration::from_millis(20),
    silence: Duration::from_secs(5),
};

/// Three ranks through the rendezvous, each with its channel and fault state (no exit).
fn three_ranks() -> Vec<(Liveness, Arc<FaultState>)> {
    run_ranks(3, &[0, 1, 2], Duration::from_secs(10), |_| "fp8".into())
        .into_iter()
        .enumerate()
        .map(|(rank, rdv)| {
            let fault = FaultState::new(rank, None);
            let live = Liveness::start(rank, rdv.unwrap().link, TIMING, fault.clone()).unwrap();
            (live, fault)
        })
        .collect()
}

fn wait_for(faults: &[&Arc<FaultState>], within: Duration) {
    let start = Instant::now();
    while faults.iter().any(|f| !f.is_raised()) {
        assert!(start.elapsed() < within, "no fault within {within:?}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn a_rank_that_dies_is_noticed_by_every_other() {
    let mut ranks = three_ranks();
    // Dropped without `finish`: its connections close without BYE, as when its process dies.
    let (dead, _) = ranks.remove(2);
    drop(dead);
    wait_for(&[&ranks[0].1, &ranks[1].1], Duration::from_secs(2));
    for (live, fault) in &ranks {
        let e = fault.check().unwrap_err().to_string();
        assert!(e.contains("rank 2 closed its connection without finishing"), "rank {}: {e}", live.rank());
    }
}

#[test]
fn a_fault_on_one_rank_reaches_every_other_with_its_message() {
    let ranks = three_ranks();
    ranks[1].1.raise("a collective timed out");
    wait_for(&[&ranks[0].1, &ranks[2].1], Duration::from_secs(2));
    for rank in [0, 2] {
        let e = ranks[rank].1.check().unwrap_err().to_string();
        assert_eq!(e, "distributed run: rank 1: a collective timed out", "rank {rank}");
    }
}

#[test]
fn rank_zero_dying_is_noticed() {
    let mut ranks = three_ranks();
    let (root, _) = ranks.remove(0);
    drop(root);
    wait_for(&[&ranks[0].1, &ranks[1].1], Duration::from_secs(2));
    let e = ranks[0].1.check().unwrap_err().to_string();
    assert!(e.contains("rank 0 closed its connection"), "{e}");
}

#[test]
fn a_clean_finish_is_no_fault() {
    let ranks = three_ranks();
    // Let heartbeats flow a little first.
    std::thread::sleep(Duration::from_millis(100));
    let faults: Vec<_> = ranks.iter().map(|(_, f)| f.clone()).collect();
    // Non-zero ranks finish first and rank 0 last, then the other way round does not matter.
    for (live, _) in ranks.into_iter().rev() {
        live.finish();
    }
    std::thread::sleep(Duration::from_millis(200));
    for (rank, fault) in faults.iter().enumerate() {
        assert!(fault.check().is_ok(), "rank {rank}: {:?}", fault.message());
    }
}

#[test]
fn a_silent_peer_is_lost_after_the_silence_limit() {
    let rdv = run_ranks(2, &[0, 1], Duration::from_secs(10), |_| "fp8".into());
    let mut rdv = rdv.into_iter();
    let root = rdv.next().unwrap().unwrap();
    // Rank 1 joined but runs no channel: its socket stays open and says nothing.
    let _silent = rdv.next().unwrap().unwrap();
    let fault = FaultState::new(0, None);
    let timing = LivenessTiming {
        heartbeat: Duration::from_millis(20),
        silence: Duration::from_millis(200),
    };
    let _live = Liveness::start(0, root.link, timing, fault.clone()).unwrap();
    wait_for(&[&fault], Duration::from_secs(2));
    let e = fault.check().unwrap_err().to_string();
    assert!(e.contains("rank 1 sent nothing for 200ms"), "{e}");
}
