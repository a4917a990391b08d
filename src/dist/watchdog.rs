//! The collective watchdog: every collective queued on a stream of ours is watched from a thread
//! until the GPU has passed it, and one that has not within the timeout is a fault.
//!
//! A collective whose peer is dead or stuck never finishes, and neither does anything ordered
//! after it; a host read behind it would wait forever. The host never waits on a collective
//! here: after queueing one, its stream records an event (`Completion`), and this thread polls
//! the events in queue order (a stream finishes its work in order, so only the oldest can be
//! late). It also polls `probe`, NCCL's asynchronous error of each communicator, which reports a
//! peer's network failure before any timeout. Either raises the fault state, whose hooks abort
//! the communicators (`ncclCommAbort` ends NCCL's kernels, so the streams drain and host reads
//! return) and tell the other ranks; the rank then ends with the error (`fault`).
//!
//! The thread knows events only through `Completion`, so that its logic is tested on the CPU.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::fault::FaultState;
use crate::error::{LowpError, Result};

/// A point in a stream that the host can test without waiting (a CUDA event).
pub trait Completion: Send {
    /// Whether the GPU has passed the point; `Err` with the driver's message if it cannot say.
    fn is_complete(&mut self) -> std::result::Result<bool, String>;
}

/// Checks for faults that no event shows (NCCL's asynchronous errors); `Some` with a message
/// when there is one.
pub type Probe = Box<dyn FnMut() -> Option<String> + Send>;

struct Pending {
    what: String,
    queued: Instant,
    done: Box<dyn Completion>,
}

struct Shared {
    queue: Mutex<VecDeque<Pending>>,
    probes: Mutex<Vec<Probe>>,
    stop: AtomicBool,
}

/// The watchdog of one rank; stops when dropped.
pub struct Watchdog {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl Watchdog {
    /// Starts the thread: every `poll` it retires finished work and checks the probes; work
    /// older than `timeout` raises `fault`.
    pub fn start(timeout: Duration, poll: Duration, fault: Arc<FaultState>) -> Result<Watchdog> {
        let shared = Arc::new(Shared {
            queue: Mutex::new(VecDeque::new()),
            probes: Mutex::new(Vec::new()),
            stop: AtomicBool::new(false),
        });
        let thread = {
            let shared = shared.clone();
            std::thread::Builder::new()
                .name("lowp-watchdog".into())
                .spawn(move || watch(&shared, timeout, poll, &fault))
                .map_err(|e| LowpError::distributed(format!("watchdog thread: {e}")))?
        };
        Ok(Watchdog {
            shared,
            thread: Some(thread),
        })
    }

    /// Watches one queued collective, described by `what` for the message if it is late.
    pub fn watch(&self, what: impl Into<String>, done: Box<dyn Completion>) {
        let pending = Pending {
            what: what.into(),
            queued: Instant::now(),
            done,
        };
        self.shared.queue.lock().unwrap_or_else(|p| p.into_inner()).push_back(pending);
    }

    /// Adds a check run on every poll.
    pub fn add_probe(&self, probe: Probe) {
        self.shared.probes.lock().unwrap_or_else(|p| p.into_inner()).push(probe);
    }

    /// Collectives queued and not yet seen finished.
    pub fn outstanding(&self) -> usize {
        self.shared.queue.lock().unwrap_or_else(|p| p.into_inner()).len()
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn watch(shared: &Shared, timeout: Duration, poll: Duration, fault: &FaultState) {
    while !shared.stop.load(Ordering::Acquire) && !fault.is_raised() {
        if let Some(message) = poll_once(shared, timeout) {
            fault.raise(message);
            return;
        }
        std::thread::sleep(poll);
    }
}

/// One round: the probes, then the queue from its oldest entry. `Some` with the fault found.
fn poll_once(shared: &Shared, timeout: Duration) -> Option<String> {
    for probe in shared.probes.lock().unwrap_or_else(|p| p.into_inner()).iter_mut() {
        if let Some(message) = probe() {
            return Some(message);
        }
    }
    let mut queue = shared.queue.lock().unwrap_or_else(|p| p.into_inner());
    while let Some(oldest) = queue.front_mut() {
        match oldest.done.is_complete() {
            Ok(true) => {
                queue.pop_front();
            }
            Ok(false) => {
                let waited = oldest.queued.elapsed();
                if waited >= timeout {
                    return Some(format!(
                        "{} has not completed {:.1} s after it was queued (timeout {:?}): a rank is \
                         dead, stuck, or issued different collectives; aborting",
                        oldest.what,
                        waited.as_secs_f64(),
                        timeout
                    ));
                }
                return None;
            }
            Err(e) => return Some(format!("{}: cannot tell whether it completed: {e}", oldest.what)),
        }
    }
    None
}
