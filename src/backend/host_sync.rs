//! Counters of the host synchronizations burn-lowp performs, so that a training loop can report
//! them per step (`host_syncs()` before and after, `HostSyncs::since`).
//!
//! * `split_reads`: host reads of grouped split sizes (their copy was requested when the splits
//!   were made); `blocking_split_reads` of those had to wait for the GPU (the copy had not arrived
//!   within [`BLOCKING_WAIT`]), `split_wait_us` is the time waited in all.
//! * `gemm_autotunes`: new GEMM shapes timed on the GPU (one host wait each, once per shape).
//! * `stream_setups`: flag buffers zeroed for a new CubeCL stream (once per stream).
//! * `debug_metric_reads`: AutoswitchGemm metrics read on the host before a GEMM (debug sessions
//!   only); `blocking_debug_metric_reads` of those waited for the GPU, `debug_wait_us` in all.
//!
//! Not synchronizations, but what the absence of one cost: `exact_batches` counts pointer-array
//! grouped GEMMs that found the splits' host copy already arrived and ran exactly the chunks the
//! groups fill, `bound_batches` those that ran the host-known bound of chunks (the copy had not
//! arrived; nothing waited for it). `device_grouped_batches` counts those that ran our Hopper
//! grouped GEMM instead of a bound batch (`sm90_grouped`; it reads the groups on the device and
//! computes only the chunks they fill), which are not counted as bound. `device_grouped_wgrads`
//! counts grouped weight gradients that ran our K-grouped kernel (`sm90_wgrad`) instead of one
//! cuBLASLt GEMM per expert.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// A read that waited longer than this blocked on the GPU; an already-arrived copy returns in a
/// few microseconds.
pub const BLOCKING_WAIT: Duration = Duration::from_micros(50);

static SPLIT_READS: AtomicU64 = AtomicU64::new(0);
static BLOCKING_SPLIT_READS: AtomicU64 = AtomicU64::new(0);
static SPLIT_WAIT_US: AtomicU64 = AtomicU64::new(0);
static GEMM_AUTOTUNES: AtomicU64 = AtomicU64::new(0);
static STREAM_SETUPS: AtomicU64 = AtomicU64::new(0);
static DEBUG_METRIC_READS: AtomicU64 = AtomicU64::new(0);
static BLOCKING_DEBUG_METRIC_READS: AtomicU64 = AtomicU64::new(0);
static DEBUG_WAIT_US: AtomicU64 = AtomicU64::new(0);
static EXACT_BATCHES: AtomicU64 = AtomicU64::new(0);
static BOUND_BATCHES: AtomicU64 = AtomicU64::new(0);
static DEVICE_GROUPED_BATCHES: AtomicU64 = AtomicU64::new(0);
static DEVICE_GROUPED_WGRADS: AtomicU64 = AtomicU64::new(0);

/// A snapshot of the counters (process-wide, all devices).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct HostSyncs {
    pub split_reads: u64,
    pub blocking_split_reads: u64,
    pub split_wait_us: u64,
    pub gemm_autotunes: u64,
    pub stream_setups: u64,
    pub debug_metric_reads: u64,
    pub blocking_debug_metric_reads: u64,
    pub debug_wait_us: u64,
    pub exact_batches: u64,
    pub bound_batches: u64,
    pub device_grouped_batches: u64,
    pub device_grouped_wgrads: u64,
}

impl HostSyncs {
    /// The counts since `earlier`.
    pub fn since(&self, earlier: &HostSyncs) -> HostSyncs {
        HostSyncs {
            split_reads: self.split_reads - earlier.split_reads,
            blocking_split_reads: self.blocking_split_reads - earlier.blocking_split_reads,
            split_wait_us: self.split_wait_us - earlier.split_wait_us,
            gemm_autotunes: self.gemm_autotunes - earlier.gemm_autotunes,
            stream_setups: self.stream_setups - earlier.stream_setups,
            debug_metric_reads: self.debug_metric_reads - earlier.debug_metric_reads,
            blocking_debug_metric_reads: self.blocking_debug_metric_reads
                - earlier.blocking_debug_metric_reads,
            debug_wait_us: self.debug_wait_us - earlier.debug_wait_us,
            exact_batches: self.exact_batches - earlier.exact_batches,
            bound_batches: self.bound_batches - earlier.bound_batches,
            device_grouped_batches: self.device_grouped_batches - earlier.device_grouped_batches,
            device_grouped_wgrads: self.device_grouped_wgrads - earlier.device_grouped_wgrads,
        }
    }

    /// Synchronizations that stalled the host on the GPU.
    pub fn blocking(&self) -> u64 {
        self.blocking_split_reads
            + self.gemm_autotunes
            + self.stream_setups
            + self.blocking_debug_metric_reads
    }
}

pub fn host_syncs() -> HostSyncs {
    HostSyncs {
        split_reads: SPLIT_READS.load(Ordering::Relaxed),
        blocking_split_reads: BLOCKING_SPLIT_READS.load(Ordering::Relaxed),
        split_wait_us: SPLIT_WAIT_US.load(Ordering::Relaxed),
        gemm_autotunes: GEMM_AUTOTUNES.load(Ordering::Relaxed),
        stream_setups: STREAM_SETUPS.load(Ordering::Relaxed),
        debug_metric_reads: DEBUG_METRIC_READS.load(Ordering::Relaxed),
        blocking_debug_metric_reads: BLOCKING_DEBUG_METRIC_READS.load(Ordering::Relaxed),
        debug_wait_us: DEBUG_WAIT_US.load(Ordering::Relaxed),
        exact_batches: EXACT_BATCHES.load(Ordering::Relaxed),
        bound_batches: BOUND_BATCHES.load(Ordering::Relaxed),
        device_grouped_batches: DEVICE_GROUPED_BATCHES.load(Ordering::Relaxed),
        device_grouped_wgrads: DEVICE_GROUPED_WGRADS.load(Ordering::Relaxed),
    }
}

pub(crate) fn record_split_read(waited: Duration) {
    SPLIT_READS.fetch_add(1, Ordering::Relaxed);
    SPLIT_WAIT_US.fetch_add(waited.as_micros() as u64, Ordering::Relaxed);
    if waited > BLOCKING_WAIT {
        BLOCKING_SPLIT_READS.fetch_add(1, Ordering::Relaxed);
    }
}

#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub(crate) fn record_gemm_autotune() {
    GEMM_AUTOTUNES.fetch_add(1, Ordering::Relaxed);
}

#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub(crate) fn record_stream_setup() {
    STREAM_SETUPS.fetch_add(1, Ordering::Relaxed);
}

pub(crate) fn record_debug_metric_read(waited: Duration) {
    DEBUG_METRIC_READS.fetch_add(1, Ordering::Relaxed);
    DEBUG_WAIT_US.fetch_add(waited.as_micros() as u64, Ordering::Relaxed);
    if waited > BLOCKING_WAIT {
        BLOCKING_DEBUG_METRIC_READS.fetch_add(1, Ordering::Relaxed);
    }
}

#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub(crate) fn record_pointer_array_batch(exact: bool) {
    if exact {
        EXACT_BATCHES.fetch_add(1, Ordering::Relaxed);
    } else {
        BOUND_BATCHES.fetch_add(1, Ordering::Relaxed);
    }
}

/// A graph-safe grouped GEMM that ran our Hopper kernel (`sm90_grouped`) rather than a
/// pointer-array batch.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub(crate) fn record_device_grouped_batch() {
    DEVICE_GROUPED_BATCHES.fetch_add(1, Ordering::Relaxed);
}

/// A grouped weight gradient that ran our K-grouped kernel (`sm90_wgrad`).
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub(crate) fn record_device_grouped_wgrad() {
    DEVICE_GROUPED_WGRADS.fetch_add(1, Ordering::Relaxed);
}
