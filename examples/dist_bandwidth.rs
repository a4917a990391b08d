//! Bandwidth of burn-lowp's collectives on CubeCL buffers (`burn_lowp::dist::Collectives`): the
//! even all-to-all that expert parallelism's token exchange is, and the all-reduce of data
//! parallelism's gradients, over every rank of one host. `benches/dist/collectives_torch.py` is the
//! PyTorch peer (`torch.distributed` on NCCL, the same sizes), run in the same call.
//!
//! ```text
//! cargo build --release --features nccl --example dist_bandwidth
//! target/release/examples/dist_bandwidth --nproc-per-node 4
//! ```
//!
//! Each size runs 5 untimed iterations, then 20 between two host synchronisations. Printed per
//! size, as nccl-tests print them: the algorithm bandwidth (bytes a rank hands to the call per
//! second) and the bus bandwidth (what crosses a rank's links per second: `(n - 1) / n` of it for
//! the all-to-all, `2 (n - 1) / n` for the all-reduce), which is what compares with NVLink's
//! per-direction rate. Rank 0 prints.

use std::ffi::OsString;
use std::process::ExitCode;
use std::time::Instant;

use burn_lowp::dist::{run_rank_program, Fingerprint, ProcessGroup, RankSetup, ReduceDtype, ReduceOp};
use burn_lowp::{LowpError, Result};
use burn_lowp_kernels::cubecl::cuda::{CudaDevice, CudaRuntime};
use burn_lowp_kernels::cubecl::prelude::*;

const WARMUP: usize = 5;
const ITERS: usize = 20;
/// Bytes a rank sends (all-to-all) or reduces (all-reduce, f32) per call.
const SIZES: [usize; 4] = [16 << 20, 64 << 20, 256 << 20, 1 << 30];

fn main() -> ExitCode {
    let args: Vec<OsString> = std::env::args_os().skip(1).collect();
    match run_rank_program(&args, setup, bench) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn setup(rest: &[OsString]) -> Result<RankSetup<()>> {
    if !rest.is_empty() {
        return Err(LowpError::invalid("arguments", format!("{rest:?}"), "takes none besides --nproc-per-node"));
    }
    Ok(RankSetup {
        options: (),
        fingerprints: vec![Fingerprint::of("bench", b"dist_bandwidth")],
        expert_parallel_size: 1,
    })
}

fn bench(group: &ProcessGroup, _: ()) -> Result<()> {
    let n = group.world_size();
    let client = CudaRuntime::client(&CudaDevice::new(group.device));
    let sync = || -> Result<()> {
        burn_lowp_kernels::cubecl::future::block_on(client.sync())
            .map_err(|e| LowpError::distributed(format!("CubeCL sync: {e:?}")))?;
        group.check()
    };
    if group.rank() == 0 {
        println!("| collective | ranks | MiB a rank | ms a call | algorithm GB/s | bus GB/s |");
        println!("|---|---|---|---|---|---|");
    }
    for &bytes in &SIZES {
        let block = bytes / n;
        let bytes = block * n;
        let send = client.empty(bytes);
        let recv = client.empty(bytes);
        let time = |call: &dyn Fn() -> Result<()>| -> Result<f64> {
            for _ in 0..WARMUP {
                call()?;
            }
            sync()?;
            let start = Instant::now();
            for _ in 0..ITERS {
                call()?;
            }
            sync()?;
            Ok(start.elapsed().as_secs_f64() / ITERS as f64)
        };
        let a2a = time(&|| group.world.all_to_all(&send, vec![block; n], &recv, vec![block; n]))?;
        let ar = time(&|| group.world.all_reduce(&send, &recv, bytes / 4, ReduceDtype::F32, ReduceOp::Sum))?;
        if group.rank() == 0 {
            let mib = bytes as f64 / (1 << 20) as f64;
            for (name, secs, factor) in [("all-to-all", a2a, (n - 1) as f64 / n as f64), ("all-reduce f32", ar, 2.0 * (n - 1) as f64 / n as f64)] {
                let algbw = bytes as f64 / secs / 1e9;
                println!("| {name} | {n} | {mib:.0} | {:.3} | {algbw:.1} | {:.1} |", secs * 1e3, algbw * factor);
            }
        }
    }
    Ok(())
}
