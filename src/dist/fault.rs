//! A rank's fault state: the first thing that went wrong in the run, whoever noticed it.
//!
//! Three things notice faults, on threads of their own: the collective watchdog (`watchdog`: a
//! collective that does not finish, an asynchronous NCCL error), the liveness channel
//! (`liveness`: a peer that died or reported a fault), and a collective that fails on CubeCL's
//! device thread after its call returned. Each calls `FaultState::raise`; the first raise runs
//! the hooks once (abort the NCCL communicators so that no kernel waits forever for a dead peer,
//! tell the other ranks), and from then on `check` returns the error, which the training loop
//! calls once a step. Since the main thread may be stuck where no check runs (a host read of a
//! stream held by a collective that never ends), a raise also arms an exit: after a grace period
//! the process prints the fault and exits with `FAULT_EXIT_CODE`. Checkpoints must therefore be
//! written to a temporary file and renamed, so that such an exit leaves the last good one.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::error::{LowpError, Result};

/// The exit status of a rank ended by a fault it could not return from (`sysexits`'
/// EX_SOFTWARE).
pub const FAULT_EXIT_CODE: i32 = 70;

type Hook = Box<dyn FnOnce(&str) + Send>;

/// Shared by every part of a rank that can notice or must react to a fault.
pub struct FaultState {
    rank: usize,
    raised: AtomicBool,
    first: Mutex<Option<String>>,
    hooks: Mutex<Vec<Hook>>,
    /// How long after a raise the process exits if it has not ended by itself; `None` never
    /// (tests, and callers that handle the fault themselves).
    exit_after: Option<Duration>,
}

impl FaultState {
    pub fn new(rank: usize, exit_after: Option<Duration>) -> Arc<FaultState> {
        Arc::new(FaultState {
            rank,
            raised: AtomicBool::new(false),
            first: Mutex::new(None),
            hooks: Mutex::new(Vec::new()),
            exit_after,
        })
    }

    /// Runs `hook` with the fault's message on the first raise (at once if one came already).
    pub fn on_fault(&self, hook: impl FnOnce(&str) + Send + 'static) {
        let mut hooks = self.hooks.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(message) = self.message() {
            drop(hooks);
            hook(&message);
            return;
        }
        hooks.push(Box::new(hook));
    }

    /// Records a fault; only the first counts. Runs the hooks, prints the fault, arms the exit.
    pub fn raise(&self, message: impl Into<String>) {
        let message = message.into();
        {
            let mut first = self.first.lock().unwrap_or_else(|p| p.into_inner());
            if first.is_some() {
                return;
            }
            *first = Some(message.clone());
            self.raised.store(true, Ordering::Release);
        }
        eprintln!("burn-lowp rank {}: {message}", self.rank);
        // Armed before the hooks run, since a hook may hang (`ncclCommAbort` has in some NCCL
        // versions).
        if let Some(grace) = self.exit_after {
            let rank = self.rank;
            let spawned = std::thread::Builder::new()
                .name("lowp-fault-exit".into())
                .spawn(move || {
                    std::thread::sleep(grace);
                    eprintln!(
                        "burn-lowp rank {rank}: still running {grace:?} after the fault above; exiting with status {FAULT_EXIT_CODE}"
                    );
                    std::process::exit(FAULT_EXIT_CODE);
                });
            if spawned.is_err() {
                std::process::exit(FAULT_EXIT_CODE);
            }
        }
        let hooks = std::mem::take(&mut *self.hooks.lock().unwrap_or_else(|p| p.into_inner()));
        for hook in hooks {
            hook(&message);
        }
    }

    pub fn is_raised(&self) -> bool {
        self.raised.load(Ordering::Acquire)
    }

    /// The first fault's message, if any.
    pub fn message(&self) -> Option<String> {
        self.first.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// `Err` once a fault was raised: what the training loop calls between steps.
    pub fn check(&self) -> Result<()> {
        if !self.is_raised() {
            return Ok(());
        }
        match self.message() {
            Some(message) => Err(LowpError::distributed(message)),
            None => Ok(()),
        }
    }
}
