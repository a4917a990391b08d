//! A process-wide choice between two ways of running something on CUDA, for measuring one
//! against the other on the GPU: set by the program (`Setting::set`), else read once per process
//! from an environment variable, else the default. An unknown value is reported on stderr once
//! and ignored.

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Once;

/// The setting's value is an index into `values` (the names its variable takes).
pub(crate) struct Setting {
    code: AtomicU8,
    var: &'static str,
    values: [&'static str; 2],
    default: u8,
    reported: Once,
}

/// `code` before the first `get` or `set`.
const UNRESOLVED: u8 = u8::MAX;

impl Setting {
    pub(crate) const fn new(var: &'static str, values: [&'static str; 2], default: u8) -> Self {
        Setting {
            code: AtomicU8::new(UNRESOLVED),
            var,
            values,
            default,
            reported: Once::new(),
        }
    }

    /// The value in use (0 or 1): set, else the variable (read once), else the default.
    pub(crate) fn get(&self) -> u8 {
        match self.code.load(Ordering::Relaxed) {
            UNRESOLVED => {
                let code = match std::env::var(self.var) {
                    Ok(v) => match self.values.iter().position(|name| *name == v) {
                        Some(i) => i as u8,
                        None => {
                            self.reported.call_once(|| {
                                eprintln!(
                                    "burn-lowp: {}={v:?} is neither `{}` nor `{}`; using `{}`",
                                    self.var,
                                    self.values[0],
                                    self.values[1],
                                    self.values[self.default as usize]
                                )
                            });
                            self.default
                        }
                    },
                    Err(_) => self.default,
                };
                // A `set` made meanwhile wins.
                let _ = self.code.compare_exchange(UNRESOLVED, code, Ordering::Relaxed, Ordering::Relaxed);
                self.code.load(Ordering::Relaxed)
            }
            code => code,
        }
    }

    pub(crate) fn set(&self, code: u8) {
        self.code.store(code, Ordering::Relaxed);
    }
}
