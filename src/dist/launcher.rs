//! `--nproc-per-node N`: one host's ranks started by the program itself, torchrun-style.
//!
//! The launcher runs N copies of a program (the current executable, without the
//! `--nproc-per-node` argument) with the variables `env` reads: RANK = LOCAL_RANK = 0..N,
//! WORLD_SIZE = LOCAL_WORLD_SIZE = N, MASTER_ADDR = 127.0.0.1 and a free MASTER_PORT. It does not
//! set CUDA_VISIBLE_DEVICES: every rank sees every GPU and LOCAL_RANK picks its own
//! (`LaunchEnv::device_index`), as under torchrun, so that the binary behaves the same under
//! either launcher and NCCL sees the whole host's topology; a CUDA_VISIBLE_DEVICES the user set
//! passes through and chooses which GPUs the ranks take. NCCL_NVLS_ENABLE is set to 0 unless the
//! user set it: NVLink multicast (NVLS) stays off on the GPU machines this project runs on.
//!
//! Each child's output lines reach the launcher's stdout and stderr prefixed with `[rank r]`.
//! When a rank fails, the others get `grace` to notice (the liveness channel ends them within
//! moments) and are then killed; the error names the first rank that failed and how.

use std::ffi::OsString;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::env;
use crate::error::{LowpError, Result};

/// The argument, and torchrun's spelling of it.
pub const NPROC_ARG: &str = "--nproc-per-node";
const NPROC_ARG_TORCHRUN: &str = "--nproc_per_node";

/// What to start.
#[derive(Debug, Clone)]
pub struct LaunchOptions {
    pub nproc: usize,
    pub program: PathBuf,
    pub args: Vec<OsString>,
    /// MASTER_ADDR for the children: the loopback, since all ranks run here.
    pub master_addr: String,
    /// MASTER_PORT; `None` picks a free one.
    pub master_port: Option<u16>,
    /// How long the other ranks may run on after one failed before they are killed.
    pub grace: Duration,
    /// More variables for every child.
    pub env: Vec<(String, String)>,
    /// Prefix the children's output lines with their rank (else they inherit the launcher's).
    pub prefix_output: bool,
}

impl LaunchOptions {
    /// The current executable with `args`, on the loopback, a free port, 10 s of grace.
    pub fn current_exe(nproc: usize, args: Vec<OsString>) -> Result<LaunchOptions> {
        let program = std::env::current_exe()
            .map_err(|e| LowpError::invalid("--nproc-per-node", nproc, format!("cannot find this executable: {e}")))?;
        Ok(LaunchOptions {
            nproc,
            program,
            args,
            master_addr: "127.0.0.1".into(),
            master_port: None,
            grace: Duration::from_secs(10),
            env: Vec::new(),
            prefix_output: true,
        })
    }
}

/// Splits `--nproc-per-node N` (or `=N`, or torchrun's `--nproc_per_node`) out of `args` (the
/// arguments after the program name): the count, if given, and the arguments the ranks get.
pub fn take_nproc_arg(args: &[OsString]) -> Result<(Option<usize>, Vec<OsString>)> {
    let mut nproc = None;
    let mut rest = Vec::with_capacity(args.len());
    let mut iter = args.iter();
    while let Some(arg) = iter.next() {
        let text = arg.to_string_lossy();
        let value = if text == NPROC_ARG || text == NPROC_ARG_TORCHRUN {
            match iter.next() {
                Some(v) => v.to_string_lossy().into_owned(),
                None => return Err(LowpError::invalid(NPROC_ARG, "nothing", "needs a count of ranks")),
            }
        } else if let Some(v) = text
            .strip_prefix("--nproc-per-node=")
            .or_else(|| text.strip_prefix("--nproc_per_node="))
        {
            v.to_string()
        } else {
            rest.push(arg.clone());
            continue;
        };
        let n = match value.parse::<usize>() {
            Ok(n) if n >= 1 => n,
            _ => return Err(LowpError::invalid(NPROC_ARG, format!("{value:?}"), "must be an integer >= 1")),
        };
        if nproc.replace(n).is_some() {
            return Err(LowpError::invalid(NPROC_ARG, n, "is given twice"));
        }
    }
    Ok((nproc, rest))
}

/// A free TCP port on `addr` (bound and released: another process could take it before the
/// ranks bind it, which the rendezvous then reports as a port in use).
pub fn free_port(addr: &str) -> Result<u16> {
    TcpListener::bind((addr, 0))
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| LowpError::invalid("MASTER_ADDR", addr, format!("no free port to listen on: {e}")))
}

/// Starts the ranks and waits for all of them; `Err` names the first rank that failed.
pub fn launch(options: &LaunchOptions) -> Result<()> {
    if options.nproc == 0 {
        return Err(LowpError::invalid(NPROC_ARG, 0, "must be at least 1"));
    }
    if std::env::var_os(env::RANK).is_some() {
        return Err(LowpError::invalid(
            NPROC_ARG,
            options.nproc,
            "cannot start ranks from a process that is itself a rank (RANK is set: a launcher already runs this)",
        ));
    }
    let port = match options.master_port {
        Some(port) => port,
        None => free_port(&options.master_addr)?,
    };
    let out: Arc<Mutex<dyn Write + Send>> = Arc::new(Mutex::new(std::io::stdout()));
    let err: Arc<Mutex<dyn Write + Send>> = Arc::new(Mutex::new(std::io::stderr()));
    let mut children: Vec<Option<Child>> = Vec::with_capacity(options.nproc);
    let mut copiers: Vec<JoinHandle<()>> = Vec::new();
    for rank in 0..options.nproc {
        let mut command = Command::new(&options.program);
        command
            .args(&options.args)
            .env(env::RANK, rank.to_string())
            .env(env::LOCAL_RANK, rank.to_string())
            .env(env::WORLD_SIZE, options.nproc.to_string())
            .env(env::LOCAL_WORLD_SIZE, options.nproc.to_string())
            .env(env::MASTER_ADDR, &options.master_addr)
            .env(env::MASTER_PORT, port.to_string());
        if std::env::var_os("NCCL_NVLS_ENABLE").is_none() {
            command.env("NCCL_NVLS_ENABLE", "0");
        }
        command.envs(options.env.iter().map(|(k, v)| (k, v)));
        if options.prefix_output {
            command.stdout(Stdio::piped()).stderr(Stdio::piped());
        }
        let mut child = match command.spawn() {
            Ok(child) => child,
            Err(e) => {
                kill_all(&mut children);
                return Err(LowpError::distributed(format!(
                    "cannot start rank {rank} ({}): {e}",
                    options.program.display()
                )));
            }
        };
        let prefix = format!("[rank {rank}] ");
        if let Some(stdout) = child.stdout.take() {
            copiers.push(spawn_copier(stdout, prefix.clone(), out.clone()));
        }
        if let Some(stderr) = child.stderr.take() {
            copiers.push(spawn_copier(stderr, prefix, err.clone()));
        }
        children.push(Some(child));
    }
    let outcome = wait_all(&mut children, options.grace);
    // The copiers end when the children's pipes close; a grandchild that inherited a pipe could
    // hold it open, so they get a moment to drain and are then left behind.
    let drain_until = Instant::now() + Duration::from_secs(1);
    while copiers.iter().any(|c| !c.is_finished()) && Instant::now() < drain_until {
        std::thread::sleep(Duration::from_millis(10));
    }
    outcome
}

/// Waits for every child; after the first failure, waits `grace` more and kills the rest.
fn wait_all(children: &mut [Option<Child>], grace: Duration) -> Result<()> {
    let mut first_failure: Option<(usize, ExitStatus, Instant)> = None;
    loop {
        let mut running = 0;
        for (rank, slot) in children.iter_mut().enumerate() {
            let Some(child) = slot else { continue };
            match child.try_wait() {
                Ok(Some(status)) => {
                    *slot = None;
                    if !status.success() && first_failure.is_none() {
                        first_failure = Some((rank, status, Instant::now()));
                    }
                }
                Ok(None) => running += 1,
                Err(e) => {
                    kill_all(children);
                    return Err(LowpError::distributed(format!("cannot wait for rank {rank}: {e}")));
                }
            }
        }
        if running == 0 {
            break;
        }
        if let Some((_, _, at)) = first_failure {
            if at.elapsed() >= grace {
                kill_all(children);
                break;
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    match first_failure {
        None => Ok(()),
        Some((rank, status, _)) => Err(LowpError::distributed(format!(
            "rank {rank} failed first ({}); the other ranks were stopped",
            describe(status)
        ))),
    }
}

fn kill_all(children: &mut [Option<Child>]) {
    for child in children.iter_mut().filter_map(Option::as_mut) {
        let _ = child.kill();
        let _ = child.wait();
    }
    children.iter_mut().for_each(|slot| *slot = None);
}

fn describe(status: ExitStatus) -> String {
    #[cfg(unix)]
    {
        use std::os::unix::process::ExitStatusExt;
        if let Some(signal) = status.signal() {
            return format!("killed by signal {signal}");
        }
    }
    match status.code() {
        Some(code) => format!("exit status {code}"),
        None => status.to_string(),
    }
}

fn spawn_copier(from: impl Read + Send + 'static, prefix: String, to: Arc<Mutex<dyn Write + Send>>) -> JoinHandle<()> {
    std::thread::spawn(move || copy_prefixed(from, &prefix, &*to))
}

/// Copies `from` to `to` line by line, each line prefixed; a line is written whole under the
/// lock, so that ranks' lines interleave but never mix. Bytes pass unchanged (no UTF-8 needed).
pub fn copy_prefixed(from: impl Read, prefix: &str, to: &Mutex<dyn Write + Send>) {
    let mut reader = BufReader::new(from);
    let mut line = Vec::new();
    loop {
        line.clear();
        match reader.read_until(b'\n', &mut line) {
            Ok(0) | Err(_) => return,
            Ok(_) => {
                if !line.ends_with(b"\n") {
                    line.push(b'\n');
                }
                let mut to = to.lock().unwrap_or_else(|p| p.into_inner());
                let _ = to.write_all(prefix.as_bytes());
                let _ = to.write_all(&line);
                let _ = to.flush();
            }
        }
    }
}
