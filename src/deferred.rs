//! A value computed once, when it is first asked for: a device read that was requested early and
//! has usually arrived by then, or host work on such a read. `Deferred` holds the computation
//! until then, and afterwards the value or why it failed. The debug tools' shared reads resolve
//! this way (the grouped split sizes' `backend::host_copy::HostCopy` can also resolve itself).

use crate::error::Result;

pub(crate) enum Deferred<T> {
    Pending(Box<dyn FnOnce() -> Result<T> + Send>),
    Ready(T),
    Failed(String),
}

impl<T> Deferred<T> {
    pub(crate) fn new(compute: impl FnOnce() -> Result<T> + Send + 'static) -> Self {
        Deferred::Pending(Box::new(compute))
    }

    /// The value, computed on the first call; every call after a failed computation returns its
    /// message.
    pub(crate) fn resolve(&mut self) -> std::result::Result<&mut T, String> {
        if let Deferred::Pending(_) = self {
            let Deferred::Pending(compute) = std::mem::replace(self, Deferred::Failed(String::new()))
            else {
                unreachable!("matched above")
            };
            *self = match compute() {
                Ok(value) => Deferred::Ready(value),
                Err(e) => Deferred::Failed(e.to_string()),
            };
        }
        match self {
            Deferred::Ready(value) => Ok(value),
            Deferred::Failed(e) => Err(e.clone()),
            Deferred::Pending(_) => unreachable!("resolved above"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::LowpError;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    #[test]
    fn computes_once_and_keeps_a_failure() {
        let calls = Arc::new(AtomicUsize::new(0));
        let counted = calls.clone();
        let mut d = Deferred::new(move || {
            counted.fetch_add(1, Ordering::SeqCst);
            Ok(7)
        });
        assert_eq!(*d.resolve().unwrap(), 7);
        *d.resolve().unwrap() += 1;
        assert_eq!(*d.resolve().unwrap(), 8);
        assert_eq!(calls.load(Ordering::SeqCst), 1);
        let mut failed: Deferred<u8> = Deferred::new(|| Err(LowpError::invalid("read", "x", "broke")));
        let first = failed.resolve().unwrap_err();
        assert!(first.contains("broke"), "{first}");
        assert_eq!(failed.resolve().unwrap_err(), first);
    }
}
