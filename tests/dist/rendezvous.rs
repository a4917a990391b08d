//! The TCP rendezvous over loopback, one thread per rank.

use std::net::{TcpListener, TcpStream};
use std::thread;
use std::time::{Duration, Instant};

use burn_lowp::dist::rendezvous::{bind, join, rendezvous, serve, Link, RendezvousConfig};
use burn_lowp::dist::Fingerprint;

pub fn config(rank: usize, world_size: usize, port: u16, timeout: Duration) -> RendezvousConfig {
    RendezvousConfig {
        rank,
        world_size,
        addr: "127.0.0.1".into(),
        port,
        timeout,
    }
}

pub fn fingerprints(recipe: &str) -> Vec<Fingerprint> {
    vec![
        Fingerprint::of("run config", b"{\"steps\":20}"),
        Fingerprint::of("recipe", recipe.as_bytes()),
        Fingerprint::of("model shape", b"4x256"),
    ]
}

/// Runs rank 0 on a fresh loopback listener and ranks 1.. of `ranks` in threads; each rank's
/// recipe text is `recipe(rank)`. Results in rank order.
pub fn run_ranks(
    world_size: usize,
    ranks: &[usize],
    timeout: Duration,
    recipe: impl Fn(usize) -> String,
) -> Vec<burn_lowp::Result<burn_lowp::dist::rendezvous::Rendezvous>> {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let mut listener = Some(listener);
    let handles: Vec<_> = ranks
        .iter()
        .map(|&rank| {
            let fp = fingerprints(&recipe(rank));
            let cfg = config(rank, world_size, port, timeout);
            let listener = if rank == 0 { listener.take() } else { None };
            thread::spawn(move || match listener {
                Some(l) => serve(l, &cfg, &fp, b"the nccl unique id"),
                None => join(&cfg, &fp),
            })
        })
        .collect();
    handles.into_iter().map(|h| h.join().unwrap()).collect()
}

#[test]
fn four_ranks_get_the_payload() {
    let results = run_ranks(4, &[0, 1, 2, 3], Duration::from_secs(10), |_| "fp8".into());
    for (rank, result) in results.into_iter().enumerate() {
        let rdv = result.unwrap_or_else(|e| panic!("rank {rank}: {e}"));
        assert_eq!(rdv.payload, b"the nccl unique id");
        match (rank, rdv.link) {
            (0, Link::Root { peers }) => {
                assert_eq!(peers.iter().map(|(r, _)| *r).collect::<Vec<_>>(), vec![1, 2, 3])
            }
            (_, Link::Peer { .. }) if rank > 0 => {}
            _ => panic!("rank {rank} got the wrong kind of link"),
        }
    }
}

#[test]
fn a_different_recipe_fails_every_rank_naming_the_ranks() {
    let results = run_ranks(4, &[0, 1, 2, 3], Duration::from_secs(10), |rank| {
        if rank == 2 { "mxfp8".into() } else { "fp8".into() }
    });
    for (rank, result) in results.into_iter().enumerate() {
        let e = result.err().unwrap_or_else(|| panic!("rank {rank} should fail")).to_string();
        assert!(e.contains("the recipe differs between ranks: ranks 0, 1, 3 0x"), "rank {rank}: {e}");
        assert!(e.contains("vs rank 2 0x"), "rank {rank}: {e}");
        assert!(!e.contains("run config"), "rank {rank}: {e}");
    }
}

#[test]
fn a_missing_rank_times_out_fast_naming_it() {
    let start = Instant::now();
    let results = run_ranks(3, &[0, 1], Duration::from_millis(300), |_| "fp8".into());
    assert!(start.elapsed() < Duration::from_secs(3), "took {:?}", start.elapsed());
    for (rank, result) in results.into_iter().enumerate() {
        let e = result.err().unwrap_or_else(|| panic!("rank {rank} should fail")).to_string();
        assert!(e.contains("rank 2 did not join within 300ms"), "rank {rank}: {e}");
    }
}

#[test]
fn no_rank_zero_times_out() {
    // A port nothing listens on: bound, then released.
    let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let start = Instant::now();
    let e = join(&config(1, 2, port, Duration::from_millis(300)), &fingerprints("fp8"))
        .err()
        .unwrap()
        .to_string();
    assert!(start.elapsed() < Duration::from_secs(3), "took {:?}", start.elapsed());
    assert!(e.contains("rank 1: rank 0 at 127.0.0.1:") && e.contains("did not accept"), "{e}");
}

#[test]
fn a_port_in_use_is_named() {
    let taken = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    let e = rendezvous(&config(0, 2, port, Duration::from_secs(1)), &fingerprints("fp8"), b"id")
        .err()
        .unwrap()
        .to_string();
    assert!(e.starts_with(&format!("MASTER_PORT = {port}")) && e.contains("already in use"), "{e}");
    assert!(bind("127.0.0.1", port).is_err());
}

#[test]
fn rank_zero_closing_early_is_an_error() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let fake_root = thread::spawn(move || {
        let (stream, _) = listener.accept().unwrap();
        drop(stream);
    });
    let e = join(&config(1, 2, port, Duration::from_secs(5)), &fingerprints("fp8"))
        .err()
        .unwrap()
        .to_string();
    fake_root.join().unwrap();
    assert!(e.contains("no go from rank 0 (the connection was closed"), "{e}");
}

#[test]
fn a_peer_closing_before_its_hello_is_an_error() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let root = thread::spawn(move || {
        serve(listener, &config(0, 2, port, Duration::from_secs(5)), &fingerprints("fp8"), b"id")
    });
    drop(TcpStream::connect(("127.0.0.1", port)).unwrap());
    let e = root.join().unwrap().err().unwrap().to_string();
    assert!(e.contains("sent no valid hello (the connection was closed)"), "{e}");
}

#[test]
fn disagreeing_world_sizes_and_duplicate_ranks_are_refused() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let timeout = Duration::from_secs(5);
    let root = thread::spawn(move || serve(listener, &config(0, 3, port, timeout), &fingerprints("fp8"), b"id"));
    let peers: Vec<_> = [(1, 3), (1, 3)]
        .into_iter()
        .map(|(rank, world)| thread::spawn(move || join(&config(rank, world, port, timeout), &fingerprints("fp8"))))
        .collect();
    let e = root.join().unwrap().err().unwrap().to_string();
    assert!(e.contains("two processes claim rank 1"), "{e}");
    assert!(e.contains("rank 2 did not join"), "{e}");
    for peer in peers {
        let e = peer.join().unwrap().err().unwrap().to_string();
        assert!(e.contains("rank 0 says") && e.contains("two processes claim rank 1"), "{e}");
    }

    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let root = thread::spawn(move || serve(listener, &config(0, 2, port, timeout), &fingerprints("fp8"), b"id"));
    let e = join(&config(1, 3, port, timeout), &fingerprints("fp8")).err().unwrap().to_string();
    assert!(e.contains("rank 1 was launched with WORLD_SIZE = 3 and rank 0 with 2"), "{e}");
    assert!(root.join().unwrap().is_err());
}

#[test]
fn fingerprints_are_stable() {
    // FNV-1a 64 of "a": the published test vector.
    assert_eq!(Fingerprint::of("x", b"a").value, 0xaf63dc4c8601ec8c);
    assert_eq!(Fingerprint::of("x", b"").value, 0xcbf29ce484222325);
}
