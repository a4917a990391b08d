//! `LaunchEnv`: each missing or bad variable is an error naming it, its value and the rule.

use std::collections::HashMap;
use std::time::Duration;

use burn_lowp::dist::env::DEFAULT_TIMEOUT;
use burn_lowp::dist::LaunchEnv;

fn parse(vars: &[(&str, &str)]) -> burn_lowp::Result<LaunchEnv> {
    let map: HashMap<String, String> = vars.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    LaunchEnv::from_lookup(|name| map.get(name).cloned())
}

fn error(vars: &[(&str, &str)]) -> String {
    parse(vars).expect_err("should be refused").to_string()
}

const FULL: &[(&str, &str)] = &[
    ("RANK", "3"),
    ("WORLD_SIZE", "4"),
    ("LOCAL_RANK", "1"),
    ("LOCAL_WORLD_SIZE", "2"),
    ("MASTER_ADDR", "node0"),
    ("MASTER_PORT", "29500"),
];

fn with(overrides: &[(&'static str, &'static str)]) -> Vec<(&'static str, &'static str)> {
    let mut vars: Vec<_> = FULL.iter().filter(|(k, _)| !overrides.iter().any(|(o, _)| o == k)).copied().collect();
    vars.extend(overrides.iter().filter(|(_, v)| !v.is_empty()).copied());
    vars
}

#[test]
fn no_variable_is_one_rank() {
    let env = parse(&[]).unwrap();
    assert_eq!(env, LaunchEnv::single());
    assert!(!env.is_distributed());
    assert_eq!(env.timeout, DEFAULT_TIMEOUT);
    // WORLD_SIZE = 1 needs nothing else.
    assert_eq!(parse(&[("WORLD_SIZE", "1")]).unwrap().world_size, 1);
}

#[test]
fn a_full_launch_parses() {
    let env = parse(FULL).unwrap();
    assert_eq!((env.rank, env.world_size, env.local_rank), (3, 4, 1));
    assert_eq!(env.local_world_size, Some(2));
    assert_eq!(env.master, Some(("node0".to_string(), 29500)));
    assert!(env.is_distributed());
    let env = parse(&with(&[("LOWP_DIST_TIMEOUT", "2.5")])).unwrap();
    assert_eq!(env.timeout, Duration::from_millis(2500));
}

#[test]
fn rank_without_world_size_is_refused() {
    let e = error(&[("RANK", "0")]);
    assert!(e.contains("RANK") && e.contains("WORLD_SIZE is not"), "{e}");
}

#[test]
fn missing_variables_are_named() {
    for name in ["RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"] {
        let vars: Vec<_> = FULL.iter().filter(|(k, _)| *k != name).copied().collect();
        let e = error(&vars);
        assert!(e.starts_with(&format!("{name} = unset")), "{e}");
        assert!(e.contains("WORLD_SIZE = 4"), "{e}");
    }
}

#[test]
fn bad_values_are_named_with_their_rule() {
    let cases: &[(&[(&str, &str)], &str, &str)] = &[
        (&[("WORLD_SIZE", "two")], "WORLD_SIZE = \"two\"", "integer >= 1"),
        (&[("WORLD_SIZE", "0")], "WORLD_SIZE = \"0\"", "integer >= 1"),
        (&[("RANK", "-1")], "RANK = \"-1\"", "integer >= 0"),
        (&[("RANK", "4")], "RANK = 4", "below WORLD_SIZE = 4"),
        (&[("LOCAL_RANK", "x")], "LOCAL_RANK = \"x\"", "integer"),
        (&[("RANK", "0"), ("LOCAL_RANK", "1")], "LOCAL_RANK = 1", "must not exceed RANK = 0"),
        (&[("LOCAL_RANK", "2")], "LOCAL_RANK = 2", "below LOCAL_WORLD_SIZE = 2"),
        (&[("LOCAL_WORLD_SIZE", "5")], "LOCAL_WORLD_SIZE = 5", "must not exceed WORLD_SIZE = 4"),
        (&[("MASTER_ADDR", " ")], "MASTER_ADDR = \"\"", "rank 0's host"),
        (&[("MASTER_PORT", "0")], "MASTER_PORT = \"0\"", "1..=65535"),
        (&[("MASTER_PORT", "65536")], "MASTER_PORT = \"65536\"", "1..=65535"),
        (&[("LOWP_DIST_TIMEOUT", "0")], "LOWP_DIST_TIMEOUT = \"0\"", "above 0"),
        (&[("LOWP_DIST_TIMEOUT", "soon")], "LOWP_DIST_TIMEOUT = \"soon\"", "seconds"),
        (&[("LOWP_DIST_TIMEOUT", "inf")], "LOWP_DIST_TIMEOUT = \"inf\"", "seconds"),
    ];
    for (overrides, head, rule) in cases {
        let e = error(&with(overrides));
        assert!(e.starts_with(head) && e.contains(rule), "{overrides:?}: {e}");
    }
}

#[test]
fn the_device_is_the_local_rank_or_the_only_visible_one() {
    let env = parse(FULL).unwrap();
    assert_eq!(env.device_index(8).unwrap(), 1);
    assert_eq!(env.device_index(1).unwrap(), 0);
    let e = env.device_index(0).unwrap_err().to_string();
    assert!(e.contains("needs one GPU"), "{e}");
    let env = parse(&with(&[("LOCAL_RANK", "3"), ("LOCAL_WORLD_SIZE", "4")])).unwrap();
    let e = env.device_index(2).unwrap_err().to_string();
    assert!(e.starts_with("LOCAL_RANK = 3") && e.contains("2 CUDA devices"), "{e}");
}
