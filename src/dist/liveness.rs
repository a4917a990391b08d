//! The liveness channel: the rendezvous connections kept open for the whole run.
//!
//! NCCL alone notices a dead peer late or never: a collective whose peer is gone waits until the
//! watchdog's timeout. The TCP connections notice at once: when a process dies, its kernel closes
//! its sockets and the other end reads end-of-file. So each rank keeps its rendezvous
//! connections (rank 0 to every rank, every rank to rank 0) and a thread per connection reads
//! them. Messages are one byte of kind, four of length and the body:
//! * HEARTBEAT, every `heartbeat`: a host that vanishes without closing (power, network) is
//!   noticed after `silence` without one;
//! * BYE: the rank finished cleanly, its end-of-file that follows is no fault;
//! * FAULT with a message: the sender failed and says why.
//!
//! Rank 0 relays: a fault it learns of (a peer's FAULT, end-of-file without BYE, silence) or
//! raises itself goes to every other rank as FAULT, so that every rank ends with the same
//! message naming the rank that failed, within moments, instead of each waiting out its own
//! collective timeout. A non-zero rank's faults go to rank 0, which relays them. Each rank sends
//! at most one FAULT (the fault state runs its hooks once), so relays never echo.

use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::fault::FaultState;
use super::rendezvous::Link;
use crate::error::{LowpError, Result};

const HEARTBEAT: u8 = 0;
const BYE: u8 = 1;
const FAULT: u8 = 2;
const MAX_MESSAGE: usize = 64 << 10;

/// How often to show life, and how long a silent peer is given before it counts as lost.
#[derive(Debug, Clone, Copy)]
pub struct LivenessTiming {
    pub heartbeat: Duration,
    pub silence: Duration,
}

impl LivenessTiming {
    /// A heartbeat a second; a peer silent for the run's timeout (at least 10 heartbeats) is lost.
    pub fn for_timeout(timeout: Duration) -> LivenessTiming {
        let heartbeat = Duration::from_secs(1).min(timeout / 10).max(Duration::from_millis(10));
        LivenessTiming {
            heartbeat,
            silence: timeout.max(heartbeat * 10),
        }
    }
}

/// One connection's writing half, shared by the heartbeat thread, fault reports and `finish`.
struct Conn {
    writer: Mutex<TcpStream>,
}

impl Conn {
    /// Best effort: a peer that cannot be written to is noticed by its reader.
    fn send(&self, kind: u8, body: &[u8]) {
        let mut message = vec![kind];
        message.extend((body.len().min(MAX_MESSAGE) as u32).to_le_bytes());
        message.extend(&body[..body.len().min(MAX_MESSAGE)]);
        let mut writer = self.writer.lock().unwrap_or_else(|p| p.into_inner());
        let _ = writer.write_all(&message);
    }
}

/// The running channel of one rank.
pub struct Liveness {
    rank: usize,
    conns: Arc<Vec<Conn>>,
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
}

impl Liveness {
    /// Starts reading the rendezvous connections and sending heartbeats; faults it notices are
    /// raised on `fault`, and a fault raised there by anyone is sent to the other ranks.
    pub fn start(rank: usize, link: Link, timing: LivenessTiming, fault: Arc<FaultState>) -> Result<Liveness> {
        let is_root = matches!(link, Link::Root { .. });
        let streams = match link {
            Link::Root { peers } => peers,
            Link::Peer { root } => vec![(0, root)],
        };
        let stop = Arc::new(AtomicBool::new(false));
        let mut conns = Vec::with_capacity(streams.len());
        let mut readers = Vec::with_capacity(streams.len());
        for (peer, stream) in streams {
            let io = |e: std::io::Error| LowpError::distributed(format!("liveness channel to rank {peer}: {e}"));
            let reader = stream.try_clone().map_err(io)?;
            reader.set_read_timeout(Some(timing.silence)).map_err(io)?;
            stream.set_write_timeout(Some(timing.silence)).map_err(io)?;
            let _ = stream.set_nodelay(true);
            conns.push(Conn {
                writer: Mutex::new(stream),
            });
            readers.push((peer, reader));
        }
        let conns = Arc::new(conns);
        let mut threads = Vec::new();
        for (peer, reader) in readers {
            let (fault, stop) = (fault.clone(), stop.clone());
            let spawned = std::thread::Builder::new()
                .name(format!("lowp-liveness-{peer}"))
                .spawn(move || read_peer(rank, peer, reader, timing, &fault, &stop));
            threads.push(spawned.map_err(|e| LowpError::distributed(format!("liveness thread: {e}")))?);
        }
        {
            let (conns, stop) = (conns.clone(), stop.clone());
            let spawned = std::thread::Builder::new()
                .name("lowp-heartbeat".into())
                .spawn(move || {
                    while !stop.load(Ordering::Acquire) {
                        for conn in conns.iter() {
                            conn.send(HEARTBEAT, &[]);
                        }
                        sleep_unless(&stop, timing.heartbeat);
                    }
                });
            threads.push(spawned.map_err(|e| LowpError::distributed(format!("heartbeat thread: {e}")))?);
        }
        {
            let conns = conns.clone();
            fault.on_fault(move |message| {
                // Rank 0's message already names the rank that failed; a non-zero rank names
                // itself for rank 0 to relay.
                let text = if is_root { message.to_string() } else { format!("rank {rank}: {message}") };
                for conn in conns.iter() {
                    conn.send(FAULT, text.as_bytes());
                }
            });
        }
        Ok(Liveness {
            rank,
            conns,
            stop,
            threads,
        })
    }

    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Ends the channel after a clean run: BYE to every peer, then the connections close.
    pub fn finish(mut self) {
        self.close(true);
    }

    fn close(&mut self, bye: bool) {
        self.stop.store(true, Ordering::Release);
        for conn in self.conns.iter() {
            if bye {
                conn.send(BYE, &[]);
            }
            let writer = conn.writer.lock().unwrap_or_else(|p| p.into_inner());
            let _ = writer.shutdown(Shutdown::Both);
        }
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
    }
}

impl Drop for Liveness {
    /// Without `finish` (an error path) the connections close without BYE, which the peers take
    /// for this rank's failure: exactly what they should conclude.
    fn drop(&mut self) {
        if !self.threads.is_empty() {
            self.close(false);
        }
    }
}

fn sleep_unless(stop: &AtomicBool, total: Duration) {
    let end = Instant::now() + total;
    while !stop.load(Ordering::Acquire) {
        let left = end.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return;
        }
        std::thread::sleep(left.min(Duration::from_millis(20)));
    }
}

/// Reads one peer until BYE, a fault, or our own stop.
fn read_peer(rank: usize, peer: usize, mut reader: TcpStream, timing: LivenessTiming, fault: &FaultState, stop: &AtomicBool) {
    let lost = |why: &str| {
        if !stop.load(Ordering::Acquire) {
            fault.raise(format!("rank {peer} {why} (seen by rank {rank})"));
        }
    };
    loop {
        let mut head = [0u8; 5];
        match read_full(&mut reader, &mut head) {
            Ok(()) => {}
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                return lost(&format!("sent nothing for {:?}: its host or network is down", timing.silence));
            }
            // A process that dies with our heartbeats unread resets the connection instead.
            Err(e) if matches!(
                e.kind(),
                ErrorKind::UnexpectedEof | ErrorKind::ConnectionReset | ErrorKind::ConnectionAborted
            ) =>
            {
                return lost("closed its connection without finishing: it died or was killed (see its output)");
            }
            Err(e) => return lost(&format!("is unreachable: {e}")),
        }
        let len = u32::from_le_bytes([head[1], head[2], head[3], head[4]]) as usize;
        if len > MAX_MESSAGE {
            return lost(&format!("sent a malformed liveness message ({len} bytes)"));
        }
        let mut body = vec![0u8; len];
        if let Err(e) = read_full(&mut reader, &mut body) {
            return lost(&format!("broke off a liveness message: {e}"));
        }
        match head[0] {
            HEARTBEAT => {}
            BYE => return,
            FAULT => {
                if !stop.load(Ordering::Acquire) {
                    fault.raise(String::from_utf8_lossy(&body).into_owned());
                }
                return;
            }
            kind => return lost(&format!("sent an unknown liveness message (kind {kind})")),
        }
    }
}

fn read_full(reader: &mut TcpStream, buf: &mut [u8]) -> std::io::Result<()> {
    let mut filled = 0;
    while filled < buf.len() {
        match reader.read(&mut buf[filled..]) {
            Ok(0) => return Err(ErrorKind::UnexpectedEof.into()),
            Ok(n) => filled += n,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}
