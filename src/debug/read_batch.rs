//! The device buffers of several statistics fetched by one device read. Every CubeCL read is a
//! blocking round trip to the runtime's device thread (`submit_blocking`: the host waits for the
//! launches queued before it), so one read per statistic made a debugged step wait for the
//! device thread about 150 times per step (MEASUREMENTS.md, "Precision debugging on the MoE
//! example"). An observation collects its buffers here and `flush` reads them all at once; each
//! statistic gets a `LaterRead` of its own buffers, and the first of them to be consumed waits for
//! the read.

use std::ops::Range;
use std::sync::{Arc, Mutex};

use super::session::LaterRead;
use crate::backend::LowpBackend;
use crate::deferred::Deferred;
use crate::error::{LowpError, Result};

/// One device read shared by several consumers (each takes a range of its buffers).
struct SharedRead(Mutex<Deferred<Vec<Vec<u8>>>>);

impl SharedRead {
    fn take(&self, range: Range<usize>) -> Result<Vec<Vec<u8>>> {
        let mut read = self.0.lock().expect("shared read lock");
        match read.resolve() {
            Ok(buffers) => Ok(buffers[range].to_vec()),
            Err(e) => Err(LowpError::invalid("debug statistics read", "failed", e)),
        }
    }
}

type Sink = Box<dyn FnOnce(LaterRead)>;

/// Buffers to read and, for each group of them, where its `LaterRead` goes.
pub(crate) struct ReadBatch<Q: LowpBackend> {
    bytes: Vec<Q::Bytes>,
    sinks: Vec<(Range<usize>, Sink)>,
}

impl<Q: LowpBackend> ReadBatch<Q> {
    pub(crate) fn new() -> Self {
        ReadBatch {
            bytes: Vec::new(),
            sinks: Vec::new(),
        }
    }

    /// Adds `bytes`; at `flush`, `sink` receives the read of exactly these buffers.
    pub(crate) fn add(&mut self, bytes: Vec<Q::Bytes>, sink: impl FnOnce(LaterRead) + 'static) {
        let start = self.bytes.len();
        self.bytes.extend(bytes);
        self.sinks.push((start..self.bytes.len(), Box::new(sink)));
    }

    /// Requests one read of every buffer added and hands each sink its part.
    pub(crate) fn flush(self) {
        if self.sinks.is_empty() {
            return;
        }
        let shared = Arc::new(SharedRead(Mutex::new(Deferred::new(
            Q::bytes_to_host_later(self.bytes),
        ))));
        for (range, sink) in self.sinks {
            let shared = shared.clone();
            sink(Box::new(move || shared.take(range)));
        }
    }
}
