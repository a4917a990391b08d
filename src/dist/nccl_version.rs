//! NCCL's version: decoded from `ncclGetVersion`'s code and checked against what burn-lowp needs.
//! Plain integers (the call itself is in `nccl`), so that the rule is tested without NCCL.

use std::fmt;

use crate::error::{LowpError, Result};

/// The oldest NCCL burn-lowp runs on: the non-blocking communicators' behaviour the fault
/// handling relies on (`ncclCommInitRankConfig`, `ncclCommFinalize`, aborts that end waiting
/// kernels) settled in 2.18; BF16 reductions and `ncclAvg` are older (2.10).
pub const MIN_NCCL: NcclVersion = NcclVersion {
    major: 2,
    minor: 18,
    patch: 0,
};

/// The NCCL whose headers cudarc's bindings were generated from (cudarc's `nccl` feature): the
/// layout and version of the `ncclConfig_t` that burn-lowp passes. NCCL reads a config by its
/// `size` field, defaulting the fields its `version` predates and ignoring those it does not
/// know, so older libraries (the GPU machines' 2.28, down to `MIN_NCCL`) take it too.
pub const BINDINGS_NCCL: NcclVersion = NcclVersion {
    major: 2,
    minor: 30,
    patch: 0,
};

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct NcclVersion {
    pub major: u32,
    pub minor: u32,
    pub patch: u32,
}

impl NcclVersion {
    /// Decodes `NCCL_VERSION_CODE`: `major * 10000 + minor * 100 + patch` since 2.9,
    /// `major * 1000 + minor * 100 + patch` before.
    pub fn from_code(code: i32) -> Result<NcclVersion> {
        if code <= 0 {
            return Err(LowpError::invalid("NCCL version code", code, "must be positive"));
        }
        let code = code as u32;
        let (major, rest) = if code >= 10000 { (code / 10000, code % 10000) } else { (code / 1000, code % 1000) };
        Ok(NcclVersion {
            major,
            minor: rest / 100,
            patch: rest % 100,
        })
    }

    /// `NCCL_VERSION(major, minor, patch)` as NCCL's headers write it (2.9 and later).
    pub fn code(&self) -> u32 {
        self.major * 10000 + self.minor * 100 + self.patch
    }

    /// `Err` naming the version and the minimum when it is older than `MIN_NCCL`.
    pub fn check_supported(&self) -> Result<()> {
        if *self < MIN_NCCL {
            return Err(LowpError::invalid(
                "NCCL version",
                self,
                format!("must be at least {MIN_NCCL} (non-blocking communicators)"),
            ));
        }
        Ok(())
    }
}

impl fmt::Display for NcclVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)
    }
}
