//! `HostCopy`: a value made on the device whose copy to the host was requested when it was made
//! (the grouped split sizes), so that reading it later waits only if the GPU has not got there
//! yet.
//!
//! A copy is resolved either by its first reader (`pending`: the reader waits for the device
//! copy on its own thread) or by a resolver thread as soon as the copy arrives (`in_background`).
//! Either way a caller can ask, without ever waiting, whether the host has the value already
//! (`try_get`): the pointer-array grouped GEMM then runs exactly the chunks the splits fill
//! instead of the host-known bound, and large groups may run per group (`cuda::grouped`). With
//! the resolver thread that is the case as soon as the GPU has written the copy; with
//! first-reader resolution once something has read it (e.g. a wgrad) or, for a copy made with a
//! probe (`pending_probed`: on CUDA a `cublaslt::StreamMark` after the copy), as soon as the
//! probe says it has arrived.

use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::mpsc::{channel, Sender};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::Instant;

use super::host_sync::record_split_read;
use crate::error::{LowpError, Result};

type Wait<T> = Box<dyn FnOnce() -> Result<T> + Send>;

/// Who resolves the CUDA backend's split copies (`LOWP_SPLIT_COPY=background`, or
/// `set_split_copy`, picks the resolver thread).
///
/// Measured on an H100 (`benches/results/grouped-exact-h100/split-copy-ab/`): the resolver thread
/// lets every grouped GEMM of a step run its exact batch (at 128 experts x 512 tokens 20-25 %
/// faster than the bound), but made the BF16 GroupedLinear step (8 experts) 5-7 % slower over
/// three alternations (it waits on a CUDA event, which spins on a CPU core under CUDA's default
/// scheduling); hence first-reader resolution by default.
///
/// By default a copy also carries a probe (on CUDA a mark on the stream after it,
/// `cublaslt::StreamMark`), so that `try_get` takes it once it has arrived, with no thread and
/// no wait; `LOWP_SPLIT_COPY=read-only` leaves only the reader (the behaviour before the mark).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SplitCopy {
    /// The resolver thread, as soon as the copy arrives (`in_background`).
    Background,
    /// The first reader, or the first `try_get` after the probe says the copy has arrived
    /// (`pending_probed`; the default).
    OnRead,
    /// The first reader only (`pending`): the pointer-array GEMMs see the splits only after
    /// something has read them (e.g. the wgrad of the same layout).
    ReadOnly,
}

static SPLIT_COPY: AtomicU8 = AtomicU8::new(u8::MAX);

pub fn split_copy() -> SplitCopy {
    match SPLIT_COPY.load(Ordering::Relaxed) {
        0 => SplitCopy::Background,
        1 => SplitCopy::OnRead,
        2 => SplitCopy::ReadOnly,
        _ => match std::env::var("LOWP_SPLIT_COPY").as_deref() {
            Ok("background") => SplitCopy::Background,
            Ok("read-only") => SplitCopy::ReadOnly,
            _ => SplitCopy::OnRead,
        },
    }
}

pub fn set_split_copy(mode: SplitCopy) {
    SPLIT_COPY.store(
        match mode {
            SplitCopy::Background => 0,
            SplitCopy::OnRead => 1,
            SplitCopy::ReadOnly => 2,
        },
        Ordering::Relaxed,
    );
}

enum Slot<T> {
    /// Resolved by the first `get`, on the reader's thread.
    Pending(Wait<T>),
    /// Being resolved by the resolver thread.
    Resolving,
    Ready(T),
    Failed(String),
}

/// Tells, without waiting, whether a pending copy has arrived on the host.
pub type Arrived = Box<dyn Fn() -> bool + Send + Sync>;

struct Shared<T> {
    slot: Mutex<Slot<T>>,
    arrived: Condvar,
    /// For a pending copy: whether the device copy has arrived (then `try_get` resolves it,
    /// which takes no wait).
    probe: Option<Arrived>,
    /// Whether it has been read (the first read of a device copy is counted in `host_syncs`;
    /// a value the host made is never counted).
    read: AtomicBool,
}

impl<T> Shared<T> {
    /// Stores what the wait gave and wakes the readers waiting for it.
    fn settle(&self, waited: Result<T>) {
        *self.slot.lock().expect("host copy lock") = match waited {
            Ok(value) => Slot::Ready(value),
            Err(e) => Slot::Failed(e.to_string()),
        };
        self.arrived.notify_all();
    }
}

/// See the module docs. Clones share the copy.
pub struct HostCopy<T> {
    shared: Arc<Shared<T>>,
}

impl<T> Clone for HostCopy<T> {
    fn clone(&self) -> Self {
        HostCopy {
            shared: self.shared.clone(),
        }
    }
}

impl<T> std::fmt::Debug for HostCopy<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = match &*self.shared.slot.lock().expect("host copy lock") {
            Slot::Pending(_) => "pending",
            Slot::Resolving => "resolving",
            Slot::Ready(_) => "ready",
            Slot::Failed(_) => "failed",
        };
        write!(f, "HostCopy({state})")
    }
}

/// The process's resolver thread: runs the waits of `in_background` copies in the order they
/// were made (which is the order their copies were queued on the device).
fn resolver() -> &'static Mutex<Sender<Box<dyn FnOnce() + Send>>> {
    static RESOLVER: OnceLock<Mutex<Sender<Box<dyn FnOnce() + Send>>>> = OnceLock::new();
    RESOLVER.get_or_init(|| {
        let (send, receive) = channel::<Box<dyn FnOnce() + Send>>();
        std::thread::Builder::new()
            .name("lowp-host-copies".into())
            .spawn(move || {
                for job in receive {
                    job();
                }
            })
            .expect("spawn the host copy resolver thread");
        Mutex::new(send)
    })
}

impl<T: Clone + Send + 'static> HostCopy<T> {
    fn with(slot: Slot<T>) -> Self {
        Self::probed(slot, None)
    }

    fn probed(slot: Slot<T>, probe: Option<Arrived>) -> Self {
        let from_host = matches!(slot, Slot::Ready(_));
        HostCopy {
            shared: Arc::new(Shared {
                slot: Mutex::new(slot),
                arrived: Condvar::new(),
                probe,
                read: AtomicBool::new(from_host),
            }),
        }
    }

    /// A value the host already has (reading it is not a device read).
    pub fn ready(value: T) -> Self {
        Self::with(Slot::Ready(value))
    }

    /// A value `wait` produces once the device copy has arrived, resolved by its first reader.
    pub fn pending(wait: impl FnOnce() -> Result<T> + Send + 'static) -> Self {
        Self::with(Slot::Pending(Box::new(wait)))
    }

    /// `pending`, with `arrived` telling without waiting whether the device copy has arrived:
    /// `try_get` then resolves it (a wait that returns at once) instead of answering `None`.
    pub fn pending_probed(
        wait: impl FnOnce() -> Result<T> + Send + 'static,
        arrived: impl Fn() -> bool + Send + Sync + 'static,
    ) -> Self {
        Self::probed(Slot::Pending(Box::new(wait)), Some(Box::new(arrived)))
    }

    /// A value `wait` produces once the device copy has arrived, resolved by the resolver thread
    /// as soon as it has (so `try_get` sees it without anyone reading it first).
    pub fn in_background(wait: impl FnOnce() -> Result<T> + Send + 'static) -> Self {
        let copy = Self::with(Slot::Resolving);
        let shared = copy.shared.clone();
        let job = Box::new(move || shared.settle(wait()));
        if let Err(refused) = resolver().lock().expect("resolver lock").send(job) {
            // The resolver thread is gone (it never exits while the process runs): resolve here.
            (refused.0)();
        }
        copy
    }

    /// A copy of the same value that the host does not know yet: its first reader resolves it
    /// (by reading this one). Benchmarks and tests use it to run what happens before the
    /// device copy arrives.
    pub fn unresolved(&self) -> Self {
        let source = self.clone();
        Self::pending(move || source.get())
    }

    /// The value, waiting for the copy if it has not arrived (the first read of a device copy is
    /// counted in `host_syncs`, with the time it waited).
    pub fn get(&self) -> Result<T> {
        let started = Instant::now();
        let mut slot = self.shared.slot.lock().expect("host copy lock");
        loop {
            match &*slot {
                Slot::Pending(_) => {
                    let Slot::Pending(wait) = std::mem::replace(&mut *slot, Slot::Resolving) else {
                        unreachable!("matched above")
                    };
                    // Waits without the lock, so that `try_get` (e.g. on CubeCL's device thread,
                    // which the wait may need) never blocks on it.
                    drop(slot);
                    self.shared.settle(wait());
                    slot = self.shared.slot.lock().expect("host copy lock");
                }
                Slot::Resolving => {
                    slot = self.shared.arrived.wait(slot).expect("host copy lock");
                }
                Slot::Ready(_) | Slot::Failed(_) => break,
            }
        }
        if !self.shared.read.swap(true, Ordering::Relaxed) {
            record_split_read(started.elapsed());
        }
        match &*slot {
            Slot::Ready(value) => Ok(value.clone()),
            Slot::Failed(e) => Err(LowpError::invalid(
                "host copy of grouped split sizes",
                "failed",
                e.clone(),
            )),
            _ => unreachable!("resolved above"),
        }
    }

    /// The value if the host holds it already, or (a `pending_probed` copy) if its device copy
    /// has arrived; never waits for the GPU (and is not a read `host_syncs` counts).
    pub fn try_get(&self) -> Option<T> {
        let mut slot = self.shared.slot.lock().expect("host copy lock");
        match &*slot {
            Slot::Ready(value) => return Some(value.clone()),
            Slot::Pending(_) if self.shared.probe.as_ref().is_some_and(|arrived| arrived()) => {}
            _ => return None,
        }
        let Slot::Pending(wait) = std::mem::replace(&mut *slot, Slot::Resolving) else {
            unreachable!("matched above")
        };
        // The copy has arrived: its wait returns at once. Run without the lock, as `get` does.
        drop(slot);
        self.shared.settle(wait());
        match &*self.shared.slot.lock().expect("host copy lock") {
            Slot::Ready(value) => Some(value.clone()),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    #[test]
    fn pending_copies_resolve_once_on_the_first_read() {
        let calls = Arc::new(AtomicUsize::new(0));
        let counted = calls.clone();
        let copy = HostCopy::pending(move || {
            counted.fetch_add(1, Ordering::SeqCst);
            Ok(7u32)
        });
        assert_eq!(copy.try_get(), None, "nobody has read it");
        assert_eq!(copy.clone().get().unwrap(), 7);
        assert_eq!(copy.get().unwrap(), 7);
        assert_eq!(copy.try_get(), Some(7));
        assert_eq!(calls.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn background_copies_arrive_without_a_reader_and_keep_failures() {
        let (release, gate) = std::sync::mpsc::channel::<()>();
        let copy = HostCopy::in_background(move || {
            gate.recv().expect("released");
            Ok(vec![1u32, 2])
        });
        assert_eq!(copy.try_get(), None, "the copy has not arrived");
        release.send(()).unwrap();
        let started = Instant::now();
        while copy.try_get().is_none() {
            assert!(started.elapsed() < Duration::from_secs(10), "never resolved");
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(copy.get().unwrap(), vec![1, 2]);

        let failed: HostCopy<u8> =
            HostCopy::in_background(|| Err(LowpError::invalid("read", "x", "broke")));
        let message = failed.get().unwrap_err().to_string();
        assert!(message.contains("broke"), "{message}");
        assert!(failed.get().unwrap_err().to_string().contains("broke"));
        assert_eq!(failed.try_get(), None);
    }

    #[test]
    fn probed_copies_resolve_on_try_get_once_the_probe_says_they_arrived() {
        let arrived = Arc::new(AtomicBool::new(false));
        let calls = Arc::new(AtomicUsize::new(0));
        let (probe, counted) = (arrived.clone(), calls.clone());
        let copy = HostCopy::pending_probed(
            move || {
                counted.fetch_add(1, Ordering::SeqCst);
                Ok(3u32)
            },
            move || probe.load(Ordering::SeqCst),
        );
        assert_eq!(copy.try_get(), None, "not arrived: try_get must not wait for it");
        assert_eq!(calls.load(Ordering::SeqCst), 0, "nor resolve it");
        arrived.store(true, Ordering::SeqCst);
        assert_eq!(copy.try_get(), Some(3));
        assert_eq!(copy.get().unwrap(), 3);
        assert_eq!(calls.load(Ordering::SeqCst), 1, "resolved once");
        // A failed copy stays failed, whoever resolved it.
        let failed: HostCopy<u8> =
            HostCopy::pending_probed(|| Err(LowpError::invalid("read", "x", "broke")), || true);
        assert_eq!(failed.try_get(), None);
        assert!(failed.get().unwrap_err().to_string().contains("broke"));
    }

    #[test]
    fn unresolved_copies_read_their_source_when_first_read() {
        let ready = HostCopy::ready(5u8);
        let later = ready.unresolved();
        assert_eq!(later.try_get(), None);
        assert_eq!(later.get().unwrap(), 5);
        assert_eq!(later.try_get(), Some(5));
    }
}
