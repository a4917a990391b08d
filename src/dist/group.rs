//! A rank's process group: everything a multi-GPU run needs, put together in the order that
//! never leaves a rank waiting without a deadline.
//!
//! 1. The launch variables (`LaunchEnv`) and the layout (`ParallelLayout`) are checked.
//! 2. NCCL is loaded and its version checked (rank 0 prints it); rank 0 makes the unique ids:
//!    the world's and, where the layout has them, one per expert-parallel and per
//!    expert-data-parallel group (`ParallelLayout::unique_ids`).
//! 3. The rendezvous checks that every rank agrees (the caller's fingerprints and the NCCL
//!    version) and hands out the ids; its connections become the liveness channel.
//! 4. The rank's GPU is `LOCAL_RANK`'s (`LaunchEnv::device_index`); the watchdog starts.
//! 5. The world communicator is created, then the expert-parallel and expert-data-parallel ones
//!    from their own ids (`GroupSource`: not split from the world), every rank in the same
//!    order; all three queue on one stream of ours (`CubeclStream`), ordered against CubeCL's.
//!
//! A failure at any step drops what was built: the liveness connections close without goodbye,
//! so the other ranks end too, at once.

use std::sync::Arc;
use std::time::Duration;

use cudarc::driver::CudaContext;

use super::collective_stream::{CollectiveStream, CubeclStream};
use super::collectives::Collectives;
use super::env::LaunchEnv;
use super::fault::FaultState;
use super::liveness::{Liveness, LivenessTiming};
use super::nccl::{self, CommResources, Communicator};
use super::nccl_version::NcclVersion;
use super::rendezvous::{rendezvous, Fingerprint, RendezvousConfig};
use super::split::{GroupSource, ParallelLayout};
use super::watchdog::Watchdog;
use crate::error::{LowpError, Result};

/// How long a rank may go on after a fault before it exits on its own (`FaultState`).
const EXIT_GRACE: Duration = Duration::from_secs(10);
/// How often the watchdog looks at the queued collectives.
const WATCHDOG_POLL: Duration = Duration::from_millis(10);

pub struct ProcessGroup {
    pub env: LaunchEnv,
    pub layout: ParallelLayout,
    pub nccl_version: NcclVersion,
    /// The CUDA device of this rank: build CubeCL's device from it (`CudaDevice::new(device)`).
    pub device: usize,
    pub fault: Arc<FaultState>,
    /// Every rank: dense gradients, amaxes, metrics.
    pub world: Collectives,
    /// This rank's expert-parallel group (`layout.ep_size` consecutive ranks): token dispatch
    /// and combine.
    pub expert_parallel: Collectives,
    /// The ranks holding the same experts (`layout.ep_groups` of them): expert gradients.
    pub expert_data_parallel: Collectives,
    liveness: Option<Liveness>,
    _watchdog: Arc<Watchdog>,
}

impl ProcessGroup {
    /// The process group of a launched run, `None` for a one-rank run (no variable set, or
    /// WORLD_SIZE = 1): that needs no NCCL.
    pub fn from_env(fingerprints: &[Fingerprint], expert_parallel_size: usize) -> Result<Option<ProcessGroup>> {
        let env = LaunchEnv::from_env()?;
        if !env.is_distributed() {
            ParallelLayout::new(1, expert_parallel_size)?;
            return Ok(None);
        }
        ProcessGroup::init(env, fingerprints, expert_parallel_size).map(Some)
    }

    /// Joins the run `env` describes (WORLD_SIZE above 1); every rank calls this with its own
    /// fingerprints of what must agree (`Fingerprint::of` the run config, the recipe, the model
    /// shape).
    pub fn init(env: LaunchEnv, fingerprints: &[Fingerprint], expert_parallel_size: usize) -> Result<ProcessGroup> {
        let (rank, world_size) = (env.rank, env.world_size);
        let (addr, port) = env.master.clone().ok_or_else(|| {
            LowpError::invalid("WORLD_SIZE", world_size, "a multi-rank run needs MASTER_ADDR and MASTER_PORT")
        })?;
        let layout = ParallelLayout::new(world_size, expert_parallel_size)?;
        let nccl_version = nccl::load()?;
        if rank == 0 {
            println!(
                "burn-lowp: NCCL {nccl_version}, {world_size} ranks: {} expert-parallel group(s) of {}",
                layout.ep_groups, layout.ep_size
            );
        }
        let payload = if rank == 0 {
            let mut ids = Vec::with_capacity(layout.unique_ids() * nccl::UNIQUE_ID_BYTES);
            for _ in 0..layout.unique_ids() {
                ids.extend(nccl::new_unique_id()?);
            }
            ids
        } else {
            Vec::new()
        };
        let mut checked = fingerprints.to_vec();
        checked.push(Fingerprint {
            name: "NCCL version".into(),
            value: nccl_version.code() as u64,
        });
        checked.push(Fingerprint::of("expert_parallel_size", &(expert_parallel_size as u64).to_le_bytes()));
        let config = RendezvousConfig {
            rank,
            world_size,
            addr,
            port,
            timeout: env.timeout,
        };
        let met = rendezvous(&config, &checked, &payload)?;
        let fault = FaultState::new(rank, Some(EXIT_GRACE));
        let liveness = Liveness::start(rank, met.link, LivenessTiming::for_timeout(env.timeout), fault.clone())?;

        let driver = |what: &'static str| move |e: cudarc::driver::DriverError| LowpError::distributed(format!("CUDA driver: {what}: {e:?}"));
        let visible = CudaContext::device_count().map_err(driver("count the devices"))?;
        let device = env.device_index(visible.max(0) as usize)?;
        let ctx = CudaContext::new(device).map_err(driver("open the rank's device"))?;
        let watchdog = Arc::new(Watchdog::start(env.timeout, WATCHDOG_POLL, fault.clone())?);
        let res = CommResources {
            ctx: ctx.clone(),
            timeout: env.timeout,
            fault: fault.clone(),
            watchdog: watchdog.clone(),
        };
        let ids = UniqueIds::new(&met.payload, layout.unique_ids())?;
        let world = Communicator::init("world", ids.get(0), rank, world_size, &res)?;
        let group = |name: &str, source: GroupSource| -> Result<Communicator> {
            match source {
                GroupSource::World => Ok(world.clone()),
                GroupSource::Alone => Communicator::init(name, &nccl::new_unique_id()?, 0, 1, &res),
                GroupSource::Own { id_index, size, rank } => Communicator::init(name, ids.get(id_index), rank, size, &res),
            }
        };
        let ep_source = layout.ep_source(rank)?;
        let ep_is_world = matches!(ep_source, GroupSource::World);
        let ep = group("expert-parallel", ep_source)?;
        let edp = group("expert-data-parallel", layout.expert_dp_source(rank)?)?;
        // Two streams: the gradient reductions (world, expert-data-parallel) may run unjoined
        // beside backward (`OverlappedGradReduce`); the token exchange, which backward waits
        // for, must not queue behind them. But one communicator keeps one stream: where the
        // expert-parallel group is the world, the exchange shares the reductions' stream (one
        // communicator's operations must not run concurrently; its own order serializes them).
        let reductions: Arc<dyn CollectiveStream> = Arc::new(CubeclStream::new(device, ctx.clone(), fault.clone())?);
        let exchange: Arc<dyn CollectiveStream> = match ep_is_world {
            true => reductions.clone(),
            false => Arc::new(CubeclStream::new(device, ctx, fault.clone())?),
        };
        Ok(ProcessGroup {
            layout,
            nccl_version,
            device,
            world: Collectives::new(world, reductions.clone()),
            expert_parallel: Collectives::new(ep, exchange),
            expert_data_parallel: Collectives::new(edp, reductions),
            fault,
            liveness: Some(liveness),
            _watchdog: watchdog,
            env,
        })
    }

    pub fn rank(&self) -> usize {
        self.env.rank
    }

    pub fn world_size(&self) -> usize {
        self.env.world_size
    }

    /// `Err` once any fault was raised (a peer died, a collective timed out or failed): the
    /// training loop calls this once a step and stops with the error.
    pub fn check(&self) -> Result<()> {
        self.fault.check()
    }

    /// Tells the other ranks that this one fails with `error` (they end with its message at
    /// once, instead of noticing its exit), and aborts the communicators.
    pub fn fail(&self, error: &LowpError) {
        self.fault.raise(error.to_string());
    }

    /// Ends a clean run: after the last step's results were read, so nothing is in flight. Frees
    /// the communicators and says goodbye on the liveness channel.
    pub fn finish(mut self) -> Result<()> {
        self.check()?;
        for collectives in [&self.expert_data_parallel, &self.expert_parallel, &self.world] {
            collectives.comm().finish()?;
        }
        if let Some(liveness) = self.liveness.take() {
            liveness.finish();
        }
        Ok(())
    }
}

/// Rank 0's unique ids as the rendezvous handed them out, checked for their count.
struct UniqueIds<'a>(&'a [u8]);

impl<'a> UniqueIds<'a> {
    fn new(payload: &'a [u8], count: usize) -> Result<UniqueIds<'a>> {
        if payload.len() != count * nccl::UNIQUE_ID_BYTES {
            return Err(LowpError::invalid(
                "NCCL unique ids from rank 0",
                format!("{} bytes", payload.len()),
                format!("must be {count} ids of {} bytes (the layout's communicators)", nccl::UNIQUE_ID_BYTES),
            ));
        }
        Ok(UniqueIds(payload))
    }

    fn get(&self, index: usize) -> &'a [u8] {
        &self.0[index * nccl::UNIQUE_ID_BYTES..(index + 1) * nccl::UNIQUE_ID_BYTES]
    }
}
