//! `--nproc-per-node`: argument handling, and the launcher on `/bin/sh` children.

use std::ffi::OsString;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use burn_lowp::dist::launcher::{copy_prefixed, launch, take_nproc_arg, LaunchOptions};

fn args(list: &[&str]) -> Vec<OsString> {
    list.iter().map(OsString::from).collect()
}

#[test]
fn the_count_is_taken_out_of_the_arguments() {
    let (n, rest) = take_nproc_arg(&args(&["--config", "c.json", "--nproc-per-node", "2", "--steps", "5"])).unwrap();
    assert_eq!(n, Some(2));
    assert_eq!(rest, args(&["--config", "c.json", "--steps", "5"]));
    let (n, rest) = take_nproc_arg(&args(&["--nproc-per-node=4", "x"])).unwrap();
    assert_eq!((n, rest), (Some(4), args(&["x"])));
    let (n, _) = take_nproc_arg(&args(&["--nproc_per_node", "8"])).unwrap();
    assert_eq!(n, Some(8));
    let (n, rest) = take_nproc_arg(&args(&["--steps", "5"])).unwrap();
    assert_eq!((n, rest), (None, args(&["--steps", "5"])));
}

#[test]
fn bad_counts_are_refused() {
    for (list, rule) in [
        (&["--nproc-per-node"][..], "needs a count"),
        (&["--nproc-per-node", "0"][..], "integer >= 1"),
        (&["--nproc-per-node=two"][..], "integer >= 1"),
        (&["--nproc-per-node", "2", "--nproc-per-node=2"][..], "given twice"),
    ] {
        let e = take_nproc_arg(&args(list)).unwrap_err().to_string();
        assert!(e.starts_with("--nproc-per-node") && e.contains(rule), "{list:?}: {e}");
    }
}

fn sh(nproc: usize, script: &str, grace: Duration) -> LaunchOptions {
    LaunchOptions {
        nproc,
        program: "/bin/sh".into(),
        args: args(&["-c", script]),
        master_addr: "127.0.0.1".into(),
        master_port: None,
        grace,
        env: vec![("LOWP_TEST_MARK".into(), "yes".into())],
        prefix_output: true,
    }
}

#[test]
fn every_rank_gets_its_variables() {
    let script = r#"test "$WORLD_SIZE" = 3 && test "$LOCAL_WORLD_SIZE" = 3 && test "$LOCAL_RANK" = "$RANK" \
        && test "$MASTER_ADDR" = 127.0.0.1 && test "$MASTER_PORT" -gt 0 && test -n "$NCCL_NVLS_ENABLE" \
        && test "$LOWP_TEST_MARK" = yes && echo "rank $RANK ok""#;
    launch(&sh(3, script, Duration::from_secs(5))).unwrap();
}

#[test]
fn a_failing_rank_stops_the_others_and_is_named() {
    // Rank 1 fails at once; rank 0 would sleep for a minute (exec: the shell becomes the sleep,
    // so killing it ends the sleep).
    let script = r#"if [ "$RANK" = 1 ]; then echo "rank 1 fails" >&2; exit 3; fi; exec sleep 60"#;
    let start = Instant::now();
    let e = launch(&sh(2, script, Duration::from_millis(200))).unwrap_err().to_string();
    assert!(start.elapsed() < Duration::from_secs(10), "took {:?}", start.elapsed());
    assert_eq!(e, "distributed run: rank 1 failed first (exit status 3); the other ranks were stopped");
}

#[test]
fn a_rank_killed_by_a_signal_is_described() {
    let script = r#"if [ "$RANK" = 0 ]; then kill -9 $$; fi; exit 0"#;
    let e = launch(&sh(2, script, Duration::from_secs(5))).unwrap_err().to_string();
    assert!(e.contains("rank 0 failed first (killed by signal 9)"), "{e}");
}

#[test]
fn output_lines_are_prefixed_whole() {
    let out: Mutex<Vec<u8>> = Mutex::new(Vec::new());
    copy_prefixed(&b"first\nsecond\nno newline"[..], "[rank 3] ", &out);
    assert_eq!(
        String::from_utf8(out.into_inner().unwrap()).unwrap(),
        "[rank 3] first\n[rank 3] second\n[rank 3] no newline\n"
    );
}
