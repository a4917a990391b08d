//! NCCL's version code, decoded and checked against the minimum.

use burn_lowp::dist::nccl_version::{NcclVersion, BINDINGS_NCCL, MIN_NCCL};

#[test]
fn version_codes_decode() {
    let v = NcclVersion::from_code(22805).unwrap();
    assert_eq!((v.major, v.minor, v.patch), (2, 28, 5));
    assert_eq!(v.to_string(), "2.28.5");
    assert_eq!(v.code(), 22805);
    // Before 2.9 the code was major * 1000 + minor * 100 + patch.
    assert_eq!(NcclVersion::from_code(2708).unwrap().to_string(), "2.7.8");
    assert!(NcclVersion::from_code(0).is_err());
    assert_eq!(BINDINGS_NCCL.code(), 23000);
}

#[test]
fn older_than_2_18_is_refused() {
    assert!(NcclVersion::from_code(21800).unwrap().check_supported().is_ok());
    assert!(NcclVersion::from_code(22805).unwrap().check_supported().is_ok());
    let e = NcclVersion::from_code(21705).unwrap().check_supported().unwrap_err().to_string();
    assert!(e.starts_with("NCCL version = 2.17.5") && e.contains(&format!("at least {MIN_NCCL}")), "{e}");
}
