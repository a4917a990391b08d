//! The TCP rendezvous that starts a multi-process run (std::net only).
//!
//! Rank 0 listens on `MASTER_PORT`; every other rank connects (retrying until the deadline, since
//! rank 0 may start later) and says who it is: its rank, the world size it was launched with,
//! the protocol version and named 64-bit fingerprints of what all ranks must share (the run
//! config, the recipe, the model's shapes). Rank 0 checks that the ranks are unique and complete
//! and that everything agrees, then sends every rank the payload (NCCL's unique id, opaque here)
//! and the go; or, when something disagrees, the same error to every rank, so that each one's
//! output names the ranks and what differs. Every step has a deadline: a rank that never comes
//! ends the run with an error naming it, never a hang.
//!
//! The connections stay open after the go: they are the run's liveness channel (`liveness`),
//! which notices a rank that dies while NCCL would wait for it.

use std::collections::BTreeMap;
use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use crate::error::{LowpError, Result};

/// Bumped whenever the messages below change; a rank speaking another version is refused.
pub const PROTOCOL_VERSION: u32 = 1;
const MAGIC: [u8; 8] = *b"LOWPRDV\0";
const GO: u8 = 0;
const ABORT: u8 = 1;
/// Bounds on what a hello or reply may announce, so that a stray connection cannot make rank 0
/// allocate without limit.
const MAX_FINGERPRINTS: usize = 64;
const MAX_NAME: usize = 256;
const MAX_REPLY: usize = 1 << 20;
/// Pause between connection attempts while rank 0 is not listening yet.
const RETRY: Duration = Duration::from_millis(50);

/// Something every rank must agree on, as a name and a 64-bit hash.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fingerprint {
    pub name: String,
    pub value: u64,
}

impl Fingerprint {
    /// The fingerprint of `bytes` (FNV-1a, 64 bits: stable across builds and hosts, unlike std's
    /// hasher). Hash a canonical form: the run config's JSON as parsed and re-serialized, not its
    /// file, so that whitespace does not count.
    pub fn of(name: impl Into<String>, bytes: &[u8]) -> Fingerprint {
        let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
        for &b in bytes {
            hash ^= b as u64;
            hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
        }
        Fingerprint {
            name: name.into(),
            value: hash,
        }
    }
}

/// Where and as whom this process joins.
#[derive(Debug, Clone)]
pub struct RendezvousConfig {
    pub rank: usize,
    pub world_size: usize,
    /// Rank 0's host (`MASTER_ADDR`) and port (`MASTER_PORT`).
    pub addr: String,
    pub port: u16,
    /// How long to wait for the others, from the call.
    pub timeout: Duration,
}

/// What a rank has once every rank has joined.
pub struct Rendezvous {
    /// Rank 0's payload, the same bytes on every rank.
    pub payload: Vec<u8>,
    /// The connections, kept open for `liveness`.
    pub link: Link,
}

/// The rendezvous connections: rank 0 holds one to every other rank, the others one to rank 0.
pub enum Link {
    Root { peers: Vec<(usize, TcpStream)> },
    Peer { root: TcpStream },
}

/// Joins the run: rank 0 binds `MASTER_PORT` and serves (`serve`), the others `join`. `payload`
/// is rank 0's (ignored on other ranks).
pub fn rendezvous(config: &RendezvousConfig, fingerprints: &[Fingerprint], payload: &[u8]) -> Result<Rendezvous> {
    check_config(config)?;
    if config.rank == 0 {
        let listener = bind(&config.addr, config.port)?;
        serve(listener, config, fingerprints, payload)
    } else {
        join(config, fingerprints)
    }
}

/// Rank 0's listener: on `addr` itself when it is a loopback address (a one-host run exposes
/// nothing), else on every interface of its family, since other hosts may reach this one by a
/// name that resolves here to another address (Debian's `127.0.1.1`).
pub fn bind(addr: &str, port: u16) -> Result<TcpListener> {
    let resolved = resolve(addr, port)?;
    let local = if resolved.ip().is_loopback() {
        resolved
    } else if resolved.is_ipv4() {
        SocketAddr::from(([0, 0, 0, 0], port))
    } else {
        SocketAddr::from(([0u16; 8], port))
    };
    TcpListener::bind(local).map_err(|e| {
        let rule = if e.kind() == ErrorKind::AddrInUse {
            "is already in use on rank 0's host (another run? pick a free MASTER_PORT)".to_string()
        } else {
            format!("cannot be listened on: {e}")
        };
        LowpError::invalid("MASTER_PORT", format!("{port} ({local})"), rule)
    })
}

/// Rank 0's side, on a bound listener.
pub fn serve(
    listener: TcpListener,
    config: &RendezvousConfig,
    fingerprints: &[Fingerprint],
    payload: &[u8],
) -> Result<Rendezvous> {
    check_config(config)?;
    let deadline = Instant::now() + config.timeout;
    listener
        .set_nonblocking(true)
        .map_err(|e| LowpError::distributed(format!("rendezvous listener: {e}")))?;
    // Every connection is heard out before any verdict, so that every rank that joined gets it.
    let mut arrivals: Vec<(TcpStream, SocketAddr, std::result::Result<Hello, String>)> = Vec::new();
    while arrivals.len() + 1 < config.world_size {
        match listener.accept() {
            Ok((mut stream, from)) => {
                let hello = stream
                    .set_nonblocking(false)
                    .map_err(|e| e.to_string())
                    .and_then(|_| read_hello(&mut stream, deadline));
                arrivals.push((stream, from, hello));
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock || e.kind() == ErrorKind::Interrupted => {
                if Instant::now() >= deadline {
                    break;
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(e) => return Err(LowpError::distributed(format!("rendezvous accept: {e}"))),
        }
    }
    let mut problems = Vec::new();
    let mut joined: BTreeMap<usize, (TcpStream, Hello)> = BTreeMap::new();
    let mut refused: Vec<TcpStream> = Vec::new();
    for (stream, from, hello) in arrivals {
        let hello = match hello {
            Ok(hello) => hello,
            Err(e) => {
                problems.push(format!("a connection from {from} sent no valid hello ({e})"));
                refused.push(stream);
                continue;
            }
        };
        if let Some(problem) = check_hello(&hello, config, fingerprints) {
            problems.push(problem);
            refused.push(stream);
        } else if hello.rank == 0 {
            problems.push(format!("a second process claims rank 0 (from {from})"));
            refused.push(stream);
        } else if let Some((_, first)) = joined.get(&hello.rank) {
            problems.push(format!("two processes claim rank {} (from {} and {from})", hello.rank, first.from));
            refused.push(stream);
        } else {
            joined.insert(hello.rank, (stream, hello));
        }
    }
    let missing: Vec<String> = (1..config.world_size)
        .filter(|r| !joined.contains_key(r))
        .map(|r| r.to_string())
        .collect();
    if !missing.is_empty() {
        problems.push(format!(
            "rank{} {} did not join within {:?} (not started, crashed, or cannot reach {}:{})",
            if missing.len() > 1 { "s" } else { "" },
            missing.join(", "),
            config.timeout,
            config.addr,
            config.port
        ));
    }
    problems.extend(disagreements(fingerprints, &joined));
    if problems.is_empty() {
        problems.extend(joined.iter_mut().filter_map(|(rank, (stream, _))| {
            closed_early(stream).then(|| format!("rank {rank} closed its connection before the go"))
        }));
    }
    if !problems.is_empty() {
        let message = problems.join("; ");
        for stream in joined.values_mut().map(|(s, _)| s).chain(refused.iter_mut()) {
            let _ = write_reply(stream, ABORT, message.as_bytes());
        }
        return Err(LowpError::distributed(format!("rendezvous failed: {message}")));
    }
    let mut peers = Vec::with_capacity(joined.len());
    for (rank, (mut stream, _)) in joined {
        write_reply(&mut stream, GO, payload)
            .map_err(|e| LowpError::distributed(format!("rendezvous: sending the go to rank {rank}: {e}")))?;
        peers.push((rank, stream));
    }
    Ok(Rendezvous {
        payload: payload.to_vec(),
        link: Link::Root { peers },
    })
}

/// A non-zero rank's side: connect to rank 0 (retrying until the deadline), say hello, wait for
/// the go.
pub fn join(config: &RendezvousConfig, fingerprints: &[Fingerprint]) -> Result<Rendezvous> {
    check_config(config)?;
    let deadline = Instant::now() + config.timeout;
    let mut stream = connect(config, deadline)?;
    let hello = encode_hello(config, fingerprints)?;
    stream
        .write_all(&hello)
        .map_err(|e| LowpError::distributed(format!("rank {}: sending its hello to rank 0: {e}", config.rank)))?;
    // Rank 0 answers by its own deadline, at most `timeout` after it started listening, which
    // was before this connection: waiting that long (and a little) after connecting hears its
    // verdict rather than timing out on our own.
    let slack = config.timeout.min(Duration::from_secs(2));
    let (kind, body) = read_reply(&mut stream, Instant::now() + config.timeout + slack).map_err(|e| {
        LowpError::distributed(format!(
            "rank {}: no go from rank 0 ({e}); rank 0's output says why",
            config.rank
        ))
    })?;
    if kind == ABORT {
        return Err(LowpError::distributed(format!(
            "rendezvous failed (rank 0 says): {}",
            String::from_utf8_lossy(&body)
        )));
    }
    Ok(Rendezvous {
        payload: body,
        link: Link::Peer { root: stream },
    })
}

fn check_config(config: &RendezvousConfig) -> Result<()> {
    if config.world_size < 2 || config.rank >= config.world_size {
        return Err(LowpError::invalid(
            "rendezvous rank",
            format!("{} of {}", config.rank, config.world_size),
            "needs a world of at least 2 ranks and a rank below it",
        ));
    }
    if config.timeout.is_zero() {
        return Err(LowpError::invalid("rendezvous timeout", "0 s", "must be above 0"));
    }
    Ok(())
}

fn resolve(addr: &str, port: u16) -> Result<SocketAddr> {
    (addr, port)
        .to_socket_addrs()
        .map_err(|e| e.to_string())
        .and_then(|mut addrs| addrs.next().ok_or_else(|| "no address".to_string()))
        .map_err(|e| LowpError::invalid("MASTER_ADDR", addr, format!("does not resolve ({e})")))
}

fn connect(config: &RendezvousConfig, deadline: Instant) -> Result<TcpStream> {
    let mut last_error = String::from("no attempt");
    loop {
        let now = Instant::now();
        if now >= deadline {
            return Err(LowpError::distributed(format!(
                "rank {}: rank 0 at {}:{} did not accept a connection within {:?} (last error: {last_error})",
                config.rank, config.addr, config.port, config.timeout
            )));
        }
        // Resolved on every attempt: a host name may not resolve until its host is up.
        match resolve(&config.addr, config.port) {
            Ok(addr) => {
                let wait = (deadline - now).min(Duration::from_secs(1));
                match TcpStream::connect_timeout(&addr, wait) {
                    Ok(stream) => {
                        let _ = stream.set_nodelay(true);
                        return Ok(stream);
                    }
                    Err(e) => last_error = e.to_string(),
                }
            }
            Err(e) => last_error = e.to_string(),
        }
        std::thread::sleep(RETRY.min(deadline.saturating_duration_since(Instant::now())));
    }
}

struct Hello {
    version: u32,
    rank: usize,
    world_size: usize,
    fingerprints: Vec<Fingerprint>,
    from: SocketAddr,
}

fn encode_hello(config: &RendezvousConfig, fingerprints: &[Fingerprint]) -> Result<Vec<u8>> {
    if fingerprints.len() > MAX_FINGERPRINTS {
        return Err(LowpError::invalid(
            "rendezvous fingerprints",
            fingerprints.len(),
            format!("at most {MAX_FINGERPRINTS}"),
        ));
    }
    let mut out = MAGIC.to_vec();
    out.extend(PROTOCOL_VERSION.to_le_bytes());
    out.extend((config.rank as u32).to_le_bytes());
    out.extend((config.world_size as u32).to_le_bytes());
    out.extend((fingerprints.len() as u32).to_le_bytes());
    for f in fingerprints {
        if f.name.len() > MAX_NAME {
            return Err(LowpError::invalid(
                "rendezvous fingerprint name",
                &f.name,
                format!("at most {MAX_NAME} bytes"),
            ));
        }
        out.extend((f.name.len() as u16).to_le_bytes());
        out.extend(f.name.as_bytes());
        out.extend(f.value.to_le_bytes());
    }
    Ok(out)
}

fn read_hello(stream: &mut TcpStream, deadline: Instant) -> std::result::Result<Hello, String> {
    let from = stream.peer_addr().map_err(|e| e.to_string())?;
    let mut magic = [0u8; 8];
    read_exact_by(stream, &mut magic, deadline)?;
    if magic != MAGIC {
        return Err("not a burn-lowp rendezvous hello".into());
    }
    let version = read_u32(stream, deadline)?;
    if version != PROTOCOL_VERSION {
        // The rest may be laid out differently: report the version alone.
        return Ok(Hello {
            version,
            rank: usize::MAX,
            world_size: 0,
            fingerprints: Vec::new(),
            from,
        });
    }
    let rank = read_u32(stream, deadline)? as usize;
    let world_size = read_u32(stream, deadline)? as usize;
    let count = read_u32(stream, deadline)? as usize;
    if count > MAX_FINGERPRINTS {
        return Err(format!("{count} fingerprints (at most {MAX_FINGERPRINTS})"));
    }
    let mut fingerprints = Vec::with_capacity(count);
    for _ in 0..count {
        let mut len = [0u8; 2];
        read_exact_by(stream, &mut len, deadline)?;
        let len = u16::from_le_bytes(len) as usize;
        if len > MAX_NAME {
            return Err(format!("a fingerprint name of {len} bytes (at most {MAX_NAME})"));
        }
        let mut name = vec![0u8; len];
        read_exact_by(stream, &mut name, deadline)?;
        let mut value = [0u8; 8];
        read_exact_by(stream, &mut value, deadline)?;
        fingerprints.push(Fingerprint {
            name: String::from_utf8_lossy(&name).into_owned(),
            value: u64::from_le_bytes(value),
        });
    }
    Ok(Hello {
        version,
        rank,
        world_size,
        fingerprints,
        from,
    })
}

/// What is wrong with one hello on its own (the comparison of fingerprints comes once all are in).
fn check_hello(hello: &Hello, config: &RendezvousConfig, fingerprints: &[Fingerprint]) -> Option<String> {
    if hello.version != PROTOCOL_VERSION {
        return Some(format!(
            "the process at {} speaks rendezvous protocol {} and rank 0 speaks {PROTOCOL_VERSION} (different burn-lowp builds)",
            hello.from, hello.version
        ));
    }
    if hello.world_size != config.world_size {
        return Some(format!(
            "rank {} was launched with WORLD_SIZE = {} and rank 0 with {}",
            hello.rank, hello.world_size, config.world_size
        ));
    }
    if hello.rank >= config.world_size {
        return Some(format!(
            "the process at {} claims rank {}, outside 0..{}",
            hello.from, hello.rank, config.world_size
        ));
    }
    let names = |f: &[Fingerprint]| f.iter().map(|f| f.name.clone()).collect::<Vec<_>>();
    if names(&hello.fingerprints) != names(fingerprints) {
        return Some(format!(
            "rank {} checks {:?} and rank 0 checks {:?} (different burn-lowp builds)",
            hello.rank,
            names(&hello.fingerprints),
            names(fingerprints)
        ));
    }
    None
}

/// One line per fingerprint that differs, grouping the ranks by the value they hold.
fn disagreements(ours: &[Fingerprint], joined: &BTreeMap<usize, (TcpStream, Hello)>) -> Vec<String> {
    let mut lines = Vec::new();
    for (i, f) in ours.iter().enumerate() {
        let mut by_value: BTreeMap<u64, Vec<usize>> = BTreeMap::new();
        by_value.entry(f.value).or_default().push(0);
        for (rank, (_, hello)) in joined {
            by_value.entry(hello.fingerprints[i].value).or_default().push(*rank);
        }
        if by_value.len() > 1 {
            let mut groups: Vec<(u64, Vec<usize>)> = by_value.into_iter().collect();
            groups.sort_by_key(|(_, ranks)| ranks[0]);
            let groups: Vec<String> = groups
                .iter()
                .map(|(value, ranks)| {
                    let list: Vec<String> = ranks.iter().map(|r| r.to_string()).collect();
                    let noun = if ranks.len() > 1 { "ranks" } else { "rank" };
                    format!("{noun} {} {value:#018x}", list.join(", "))
                })
                .collect();
            lines.push(format!("the {} differs between ranks: {}", f.name, groups.join(" vs ")));
        }
    }
    lines
}

/// Whether a peer has closed its side already (it sends nothing before the go).
fn closed_early(stream: &mut TcpStream) -> bool {
    let _ = stream.set_nonblocking(true);
    let closed = matches!(stream.peek(&mut [0u8; 1]), Ok(0));
    let _ = stream.set_nonblocking(false);
    closed
}

fn write_reply(stream: &mut TcpStream, kind: u8, body: &[u8]) -> std::io::Result<()> {
    let mut out = MAGIC.to_vec();
    out.push(kind);
    out.extend((body.len() as u32).to_le_bytes());
    out.extend(body);
    stream.set_write_timeout(Some(Duration::from_secs(5)))?;
    stream.write_all(&out)
}

fn read_reply(stream: &mut TcpStream, deadline: Instant) -> std::result::Result<(u8, Vec<u8>), String> {
    let mut magic = [0u8; 8];
    read_exact_by(stream, &mut magic, deadline)?;
    if magic != MAGIC {
        return Err("rank 0 sent something that is not a rendezvous reply".into());
    }
    let mut kind = [0u8; 1];
    read_exact_by(stream, &mut kind, deadline)?;
    let len = read_u32(stream, deadline)? as usize;
    if len > MAX_REPLY || (kind[0] != GO && kind[0] != ABORT) {
        return Err(format!("a malformed reply (kind {}, {len} bytes)", kind[0]));
    }
    let mut body = vec![0u8; len];
    read_exact_by(stream, &mut body, deadline)?;
    Ok((kind[0], body))
}

fn read_u32(stream: &mut TcpStream, deadline: Instant) -> std::result::Result<u32, String> {
    let mut bytes = [0u8; 4];
    read_exact_by(stream, &mut bytes, deadline)?;
    Ok(u32::from_le_bytes(bytes))
}

/// `read_exact` that gives up at `deadline` and says how it failed.
pub(crate) fn read_exact_by(stream: &mut TcpStream, buf: &mut [u8], deadline: Instant) -> std::result::Result<(), String> {
    let mut filled = 0;
    while filled < buf.len() {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err("timed out".into());
        }
        stream.set_read_timeout(Some(left)).map_err(|e| e.to_string())?;
        match stream.read(&mut buf[filled..]) {
            Ok(0) => return Err("the connection was closed".into()),
            // A peer that closes with our bytes unread resets the connection.
            Err(e) if matches!(e.kind(), ErrorKind::ConnectionReset | ErrorKind::ConnectionAborted) => {
                return Err("the connection was closed (reset)".into())
            }
            Ok(n) => filled += n,
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                return Err("timed out".into())
            }
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(e.to_string()),
        }
    }
    Ok(())
}
