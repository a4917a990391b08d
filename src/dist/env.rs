//! The launch environment of one rank: the variables torchrun sets (and `moe_train
//! --nproc-per-node`, `launcher`), parsed and checked once at start.
//!
//! Without any of them the process is a one-rank run, so a plain `cargo run` needs nothing set.
//! Once a launcher has set `WORLD_SIZE` above 1, every other variable a rank needs must be there
//! and valid: a half-set environment would otherwise surface as a hang in the rendezvous.

use std::time::Duration;

use crate::error::{LowpError, Result};

/// How long a rank waits for the others (rendezvous, NCCL initialisation, one collective, a
/// silent peer) before it ends the run with an error, unless `LOWP_DIST_TIMEOUT` says otherwise.
/// PyTorch's NCCL process group waits 10 minutes too.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(600);

/// The variables read, for messages and for launchers that set them.
pub const RANK: &str = "RANK";
pub const WORLD_SIZE: &str = "WORLD_SIZE";
pub const LOCAL_RANK: &str = "LOCAL_RANK";
pub const LOCAL_WORLD_SIZE: &str = "LOCAL_WORLD_SIZE";
pub const MASTER_ADDR: &str = "MASTER_ADDR";
pub const MASTER_PORT: &str = "MASTER_PORT";
pub const TIMEOUT: &str = "LOWP_DIST_TIMEOUT";

/// Where this process sits in the run.
#[derive(Debug, Clone, PartialEq)]
pub struct LaunchEnv {
    /// This process's rank, `0..world_size`.
    pub rank: usize,
    pub world_size: usize,
    /// This process's index among the ranks of its host; it picks the CUDA device
    /// (`device_index`).
    pub local_rank: usize,
    /// Ranks on this host, when the launcher says (`LOCAL_WORLD_SIZE`).
    pub local_world_size: Option<usize>,
    /// Rank 0's host and the rendezvous port; `None` for a one-rank run.
    pub master: Option<(String, u16)>,
    /// `LOWP_DIST_TIMEOUT` (seconds), else `DEFAULT_TIMEOUT`.
    pub timeout: Duration,
}

impl LaunchEnv {
    /// A one-rank run: what the process is when no launcher variable is set.
    pub fn single() -> LaunchEnv {
        LaunchEnv {
            rank: 0,
            world_size: 1,
            local_rank: 0,
            local_world_size: None,
            master: None,
            timeout: DEFAULT_TIMEOUT,
        }
    }

    /// Reads the process environment.
    pub fn from_env() -> Result<LaunchEnv> {
        let bad_unicode = std::cell::RefCell::new(None);
        let env = LaunchEnv::from_lookup(|name| match std::env::var(name) {
            Ok(value) => Some(value),
            Err(std::env::VarError::NotPresent) => None,
            Err(std::env::VarError::NotUnicode(value)) => {
                bad_unicode.borrow_mut().get_or_insert((name.to_string(), value));
                None
            }
        });
        if let Some((name, value)) = bad_unicode.into_inner() {
            return Err(LowpError::invalid(name, value.to_string_lossy(), "must be valid UTF-8"));
        }
        env
    }

    /// Parses the variables as `lookup` gives them (`None`: unset), so that tests need not touch
    /// the process environment.
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<LaunchEnv> {
        let get = |name: &str| lookup(name).map(|v| v.trim().to_string());
        let timeout = match get(TIMEOUT) {
            Some(value) => parse_timeout(&value)?,
            None => DEFAULT_TIMEOUT,
        };
        let world_size = match get(WORLD_SIZE) {
            Some(value) => parse_count(WORLD_SIZE, &value, 1)?,
            None => {
                if let Some(rank) = get(RANK) {
                    return Err(LowpError::invalid(
                        RANK,
                        rank,
                        "is set but WORLD_SIZE is not: a launcher sets both (unset both for a one-GPU run)",
                    ));
                }
                return Ok(LaunchEnv { timeout, ..LaunchEnv::single() });
            }
        };
        let rank = match get(RANK) {
            Some(value) => parse_count(RANK, &value, 0)?,
            None if world_size == 1 => 0,
            None => return Err(missing(RANK, world_size)),
        };
        if rank >= world_size {
            return Err(LowpError::invalid(
                RANK,
                rank,
                format!("must be below WORLD_SIZE = {world_size}"),
            ));
        }
        let local_world_size = get(LOCAL_WORLD_SIZE)
            .map(|value| parse_count(LOCAL_WORLD_SIZE, &value, 1))
            .transpose()?;
        if let Some(local) = local_world_size {
            if local > world_size {
                return Err(LowpError::invalid(
                    LOCAL_WORLD_SIZE,
                    local,
                    format!("must not exceed WORLD_SIZE = {world_size}"),
                ));
            }
        }
        let local_rank = match get(LOCAL_RANK) {
            Some(value) => parse_count(LOCAL_RANK, &value, 0)?,
            None if world_size == 1 => 0,
            None => return Err(missing(LOCAL_RANK, world_size)),
        };
        if local_rank > rank {
            return Err(LowpError::invalid(
                LOCAL_RANK,
                local_rank,
                format!("must not exceed RANK = {rank} (a host's ranks are numbered from its first global rank)"),
            ));
        }
        if let Some(local) = local_world_size {
            if local_rank >= local {
                return Err(LowpError::invalid(
                    LOCAL_RANK,
                    local_rank,
                    format!("must be below LOCAL_WORLD_SIZE = {local}"),
                ));
            }
        }
        let master = if world_size == 1 {
            None
        } else {
            let addr = get(MASTER_ADDR).ok_or_else(|| missing(MASTER_ADDR, world_size))?;
            if addr.is_empty() {
                return Err(LowpError::invalid(MASTER_ADDR, "\"\"", "must name rank 0's host"));
            }
            let port = get(MASTER_PORT).ok_or_else(|| missing(MASTER_PORT, world_size))?;
            Some((addr, parse_port(&port)?))
        };
        Ok(LaunchEnv {
            rank,
            world_size,
            local_rank,
            local_world_size,
            master,
            timeout,
        })
    }

    pub fn is_distributed(&self) -> bool {
        self.world_size > 1
    }

    /// The CUDA device this rank uses, of `visible` devices: `LOCAL_RANK`, as under torchrun,
    /// with every device of the host visible to every rank (what NCCL's topology detection
    /// prefers). A launcher that hides all but one device from each rank (Slurm's
    /// `--gpus-per-task`, a per-rank `CUDA_VISIBLE_DEVICES`) leaves one visible: that one.
    pub fn device_index(&self, visible: usize) -> Result<usize> {
        match visible {
            0 => Err(LowpError::invalid("visible CUDA devices", 0, "a rank needs one GPU")),
            1 => Ok(0),
            _ if self.local_rank < visible => Ok(self.local_rank),
            _ => Err(LowpError::invalid(
                LOCAL_RANK,
                self.local_rank,
                format!(
                    "must be below the {visible} CUDA devices this process sees (one GPU per rank; check \
                     --nproc-per-node and CUDA_VISIBLE_DEVICES)"
                ),
            )),
        }
    }
}

fn missing(name: &str, world_size: usize) -> LowpError {
    LowpError::invalid(
        name,
        "unset",
        format!("must be set when WORLD_SIZE = {world_size} (launch with torchrun or moe_train --nproc-per-node)"),
    )
}

fn parse_count(name: &str, value: &str, min: usize) -> Result<usize> {
    match value.parse::<usize>() {
        Ok(n) if n >= min => Ok(n),
        _ => Err(LowpError::invalid(
            name,
            format!("{value:?}"),
            format!("must be an integer >= {min}"),
        )),
    }
}

fn parse_port(value: &str) -> Result<u16> {
    match value.parse::<u16>() {
        Ok(port) if port > 0 => Ok(port),
        _ => Err(LowpError::invalid(
            MASTER_PORT,
            format!("{value:?}"),
            "must be a TCP port, 1..=65535",
        )),
    }
}

fn parse_timeout(value: &str) -> Result<Duration> {
    match value.parse::<f64>() {
        Ok(seconds) if seconds.is_finite() && seconds > 0.0 && seconds <= 86_400.0 => {
            Ok(Duration::from_secs_f64(seconds))
        }
        _ => Err(LowpError::invalid(
            TIMEOUT,
            format!("{value:?}"),
            "must be seconds, a number above 0 and at most 86400",
        )),
    }
}
