//! Where a cuBLASLt GEMM's host time goes: per-phase wall-clock totals of the calls made while
//! profiling is on, so that a benchmark can print what one `gemm_quantized` costs the CPU and in
//! which step (issue 12). Off by default; when off each phase costs one relaxed atomic load.
//!
//! Phases (`GemmPhase`), in the order one call runs them:
//! * `Prepare`: on the calling thread, operand layouts and scale rewrites before the GEMM is handed
//!   to CubeCL's device thread (`cuda::gemm::prepare`, output allocation);
//! * `ToDeviceThread`: from the task being queued to it starting on CubeCL's device thread
//!   (queueing and wake-up);
//! * `Signal` (`DeviceFlags` only): launching CubeCL's READY signal kernel;
//! * `Pin`: the buffers' device pointers (`stream_for_external_work` on CubeCL's stream,
//!   `get_resource` per buffer under the other orderings);
//! * `WaitReady`: our stream waiting for CubeCL's (an event under `CubeclStream`, the READY wait
//!   kernel under `DeviceFlags`);
//! * `Enqueue`: the cuBLASLt calls (descriptor, layouts, algorithm lookup, `cublasLtMatmul`);
//! * `Done`: CubeCL's stream waiting for ours (an event, or the DONE write and CubeCL's DONE wait
//!   kernel);
//! * `FromDeviceThread`: from the task's end back to the calling thread;
//! * `Call`: the whole `gemm_quantized` call, all of the above included.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Instant;

/// One step of a cuBLASLt GEMM call (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GemmPhase {
    Prepare,
    ToDeviceThread,
    Signal,
    Pin,
    WaitReady,
    Enqueue,
    Done,
    FromDeviceThread,
    Call,
}

impl GemmPhase {
    pub const ALL: [GemmPhase; 9] = [
        GemmPhase::Prepare,
        GemmPhase::ToDeviceThread,
        GemmPhase::Signal,
        GemmPhase::Pin,
        GemmPhase::WaitReady,
        GemmPhase::Enqueue,
        GemmPhase::Done,
        GemmPhase::FromDeviceThread,
        GemmPhase::Call,
    ];

    pub fn name(self) -> &'static str {
        match self {
            GemmPhase::Prepare => "prepare",
            GemmPhase::ToDeviceThread => "to_device_thread",
            GemmPhase::Signal => "signal",
            GemmPhase::Pin => "pin",
            GemmPhase::WaitReady => "wait_ready",
            GemmPhase::Enqueue => "enqueue",
            GemmPhase::Done => "done",
            GemmPhase::FromDeviceThread => "from_device_thread",
            GemmPhase::Call => "call",
        }
    }
}

static ENABLED: AtomicBool = AtomicBool::new(false);
static NANOS: [AtomicU64; 9] = [const { AtomicU64::new(0) }; 9];
static COUNTS: [AtomicU64; 9] = [const { AtomicU64::new(0) }; 9];

/// Turns profiling on or off (process-wide). Turning it on clears the totals.
pub fn set_gemm_profiling(on: bool) {
    if on {
        for i in 0..NANOS.len() {
            NANOS[i].store(0, Ordering::Relaxed);
            COUNTS[i].store(0, Ordering::Relaxed);
        }
    }
    ENABLED.store(on, Ordering::Relaxed);
}

/// Mean host microseconds per occurrence of each phase since profiling was turned on, with the
/// number of occurrences; phases that did not occur are left out.
pub fn gemm_profile() -> Vec<(GemmPhase, f64, u64)> {
    GemmPhase::ALL
        .iter()
        .enumerate()
        .filter_map(|(i, &phase)| {
            let count = COUNTS[i].load(Ordering::Relaxed);
            (count > 0).then(|| {
                let nanos = NANOS[i].load(Ordering::Relaxed);
                (phase, nanos as f64 / count as f64 / 1e3, count)
            })
        })
        .collect()
}

/// A timestamp when profiling is on.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub(crate) fn start() -> Option<Instant> {
    ENABLED.load(Ordering::Relaxed).then(Instant::now)
}

/// Adds the time since `since` (if profiling was on when it was taken) to `phase`, and returns a
/// new timestamp so that consecutive phases chain.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub(crate) fn record(phase: GemmPhase, since: Option<Instant>) -> Option<Instant> {
    let since = since?;
    let now = Instant::now();
    let i = phase as usize;
    NANOS[i].fetch_add((now - since).as_nanos() as u64, Ordering::Relaxed);
    COUNTS[i].fetch_add(1, Ordering::Relaxed);
    Some(now)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_only_while_on() {
        set_gemm_profiling(false);
        assert!(start().is_none());
        assert!(record(GemmPhase::Pin, None).is_none());
        set_gemm_profiling(true);
        let t = start();
        std::thread::sleep(std::time::Duration::from_millis(2));
        record(GemmPhase::Pin, t);
        let profile = gemm_profile();
        set_gemm_profiling(false);
        let pin = profile
            .iter()
            .find(|(p, _, _)| *p == GemmPhase::Pin)
            .unwrap();
        assert_eq!(pin.2, 1);
        assert!(pin.1 >= 2000.0, "{pin:?}");
        assert!(profile.iter().all(|(p, _, _)| *p == GemmPhase::Pin));
    }
}
