//! Device flags that order CubeCL's CUDA stream against a foreign stream (cuBLASLt) without a
//! host synchronization. The flag buffer holds three u32: `[READY, DONE, TIMED_OUT]`.
//!
//! * `signal_kernel` runs on CubeCL's stream after the GEMM's producers and writes `value` to
//!   `READY`; the foreign stream waits for it (`value` or more) with a polling kernel of its own.
//!   (`cuStreamWaitValue32` would do, but it refuses CubeCL's pool memory.)
//! * The foreign stream writes `value` to `DONE` after the GEMM (`cuMemsetD32Async`);
//!   `wait_kernel` (one thread) holds CubeCL's stream until it sees it, so no consumer of the
//!   GEMM's output, and no reuse of its inputs' memory, can start earlier.
//!
//! Values only grow (one per GEMM), so a late or early reader never mistakes an old GEMM for a
//! new one. The wait is bounded: after `max_polls` reads it gives up and records `value` in
//! `TIMED_OUT`, which the host checks, rather than hanging the device forever on a bug.

use cubecl::prelude::*;
use cubecl::server::Handle;

use crate::util::buffers::arg;

pub const READY: usize = 0;
pub const DONE: usize = 1;
pub const TIMED_OUT: usize = 2;
pub const FLAG_WORDS: usize = 3;

#[cube(launch_unchecked)]
pub fn signal_kernel(flags: &mut Array<Atomic<u32>>, value: u32) {
    if ABSOLUTE_POS == 0 {
        flags[READY].store(value);
    }
}

/// Writes `value` to the READY word of a stream-flags buffer once everything queued before it on
/// this client's stream has run (see `stream_flags`).
pub fn signal_flag<R: Runtime>(client: &ComputeClient<R>, flags: &Handle, value: u32) {
    unsafe {
        signal_kernel::launch_unchecked::<R>(
            client,
            CubeCount::Static(1, 1, 1),
            CubeDim::new_1d(1),
            arg(flags, FLAG_WORDS),
            value,
        )
    };
}

#[cube(launch_unchecked)]
pub fn wait_kernel(flags: &mut Array<Atomic<u32>>, value: u32, max_polls: u32) {
    if ABSOLUTE_POS == 0 {
        let mut polls = 0u32;
        loop {
            // An atomic read: the compiler may not hoist it out of the loop.
            if flags[DONE].load() >= value {
                break;
            }
            polls += 1;
            if polls >= max_polls {
                flags[TIMED_OUT].store(value);
                break;
            }
        }
    }
}

/// Holds this client's stream until the DONE word of `flags` reaches `value` (or `max_polls`
/// reads pass, which it records in TIMED_OUT).
pub fn wait_flag<R: Runtime>(
    client: &ComputeClient<R>,
    flags: &Handle,
    value: u32,
    max_polls: u32,
) {
    unsafe {
        wait_kernel::launch_unchecked::<R>(
            client,
            CubeCount::Static(1, 1, 1),
            CubeDim::new_1d(1),
            arg(flags, FLAG_WORDS),
            value,
            max_polls,
        )
    };
}
