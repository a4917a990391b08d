//! A check of burn-lowp's multi-GPU layer (`burn_lowp::dist`) on real GPUs: the launcher, the
//! process group, the collectives on CubeCL buffers, and the fault handling. Needs 2 or more
//! GPUs and NCCL (docs/multi-gpu.md).
//!
//! ```text
//! cargo run --release --features nccl --example dist_smoke -- --nproc-per-node 2
//! cargo run --release --features nccl --example dist_smoke -- --nproc-per-node 4 --ep 2
//! # a rank that dies: every other rank ends with an error naming it, the launcher names rank 1
//! cargo run --release --features nccl --example dist_smoke -- --nproc-per-node 2 --die 1
//! # a rank that stays alive but skips a collective: the watchdog ends the run after the timeout
//! LOWP_DIST_TIMEOUT=5 cargo run --release --features nccl --example dist_smoke -- --nproc-per-node 2 --stall 1
//! # the same binary under torchrun
//! torchrun --nproc-per-node 2 target/release/examples/dist_smoke
//! ```
//!
//! Each rank all-reduces (sum, max, average; f32 and bf16) and checks the results exactly,
//! all-gathers per-expert token counts, then dispatches rows to their experts' EP ranks by an
//! uneven all-to-all (empty blocks included) and combines them back, checking every received
//! row and the round trip bit for bit; then the same dispatch through the MoE layer's
//! differentiable token exchange on Burn tensors (`DifferentiableAllToAll` over the EP
//! communicator), checking the received rows and the gradients that come back, exactly.

use std::ffi::OsString;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use std::sync::Arc;

use burn::backend::Autodiff;
use burn::tensor::{Int, Tensor, TensorData};
use burn_cubecl::CubeBackend;
use burn_lowp::dist::{
    run_rank_program, AllToAllSplits, DifferentiableAllToAll, ExpertSharding, Fingerprint, ProcessGroup, RankSetup, ReduceDtype,
    ReduceOp, TokenAllToAll,
};
use burn_lowp::{LowpError, Result};
use burn_lowp_kernels::cubecl::cuda::{CudaDevice, CudaRuntime};
use burn_lowp_kernels::cubecl::prelude::*;
use burn_lowp_kernels::cubecl::server::Handle;

struct Options {
    ep: usize,
    iters: usize,
    die: Option<usize>,
    stall: Option<usize>,
}

fn parse(args: &[OsString]) -> Result<Options> {
    let mut options = Options {
        ep: 1,
        iters: 20,
        die: None,
        stall: None,
    };
    let mut it = args.iter().map(|a| a.to_string_lossy().into_owned());
    while let Some(flag) = it.next() {
        let value = it
            .next()
            .ok_or_else(|| LowpError::invalid(&flag, "nothing", "needs a number"))?;
        let n: usize = value
            .parse()
            .map_err(|_| LowpError::invalid(&flag, &value, "must be a number"))?;
        match flag.as_str() {
            "--ep" => options.ep = n,
            "--iters" => options.iters = n,
            "--die" => options.die = Some(n),
            "--stall" => options.stall = Some(n),
            _ => return Err(LowpError::invalid("argument", flag, "expected --ep, --iters, --die or --stall")),
        }
    }
    Ok(options)
}

fn main() -> ExitCode {
    let args: Vec<OsString> = std::env::args_os().skip(1).collect();
    match run_rank_program(&args, setup, check) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn setup(rest: &[OsString]) -> Result<RankSetup<Options>> {
    let options = parse(rest)?;
    let joined: Vec<String> = rest.iter().map(|a| a.to_string_lossy().into_owned()).collect();
    Ok(RankSetup {
        expert_parallel_size: options.ep,
        options,
        fingerprints: vec![Fingerprint::of("arguments", joined.join(" ").as_bytes())],
    })
}

fn check(group: &ProcessGroup, options: Options) -> Result<()> {
    let start = Instant::now();
    check_collectives(group, &options)?;
    println!("rank {}: all checks passed in {:.2} s", group.rank(), start.elapsed().as_secs_f64());
    Ok(())
}

fn check_collectives(group: &ProcessGroup, options: &Options) -> Result<()> {
    let rank = group.rank();
    let world = group.world_size();
    let client = CudaRuntime::client(&CudaDevice::new(group.device));
    if options.die == Some(rank) {
        eprintln!("rank {rank}: exiting on purpose (--die)");
        std::process::exit(3);
    }
    if options.stall == Some(rank) {
        eprintln!("rank {rank}: skipping the first collective on purpose (--stall)");
        loop {
            group.check()?;
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    // All-reduces over the world, exact in both dtypes: small integers.
    let n = 1 << 20;
    let ones = (rank + 1) as f32;
    let send = client.create_from_slice(&f32_bytes(&vec![ones; n]));
    let cases = [
        (ReduceOp::Sum, (world * (world + 1) / 2) as f32),
        (ReduceOp::Max, world as f32),
        (ReduceOp::Avg, (world + 1) as f32 / 2.0),
    ];
    for (op, expected) in cases {
        let recv = client.empty(n * 4);
        group.world.all_reduce(&send, &recv, n, ReduceDtype::F32, op)?;
        let out = read(&client, recv, group)?;
        expect_all(&format!("f32 all-reduce {op:?}"), &from_f32(&out), expected)?;
    }
    let send_bf16: Vec<u8> = (0..n).flat_map(|_| half::bf16::from_f32(ones).to_le_bytes()).collect();
    let bf16 = client.create_from_slice(&send_bf16);
    // In place: this buffer has no other reader.
    group.world.all_reduce(&bf16, &bf16, n, ReduceDtype::Bf16, ReduceOp::Sum)?;
    let out = read(&client, bf16, group)?;
    let out: Vec<f32> = out.chunks(2).map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f32()).collect();
    expect_all("bf16 all-reduce Sum", &out, (world * (world + 1) / 2) as f32)?;

    // Token dispatch and combine over the expert-parallel group.
    let ep = &group.expert_parallel;
    let sharding = ExpertSharding::new(4 * ep.size(), ep.size())?;
    let experts = sharding.num_experts;
    for iter in 0..options.iters {
        let count = |r: usize, e: usize| ((r * 7 + e * 3 + iter) % 5) * 3;
        let mine: Vec<u32> = (0..experts).map(|e| count(ep.rank(), e) as u32).collect();
        let mine = client.create_from_slice(&u32_bytes(&mine));
        let table = client.empty(experts * 4 * ep.size());
        ep.all_gather(&mine, &table, experts * 4)?;
        // The one host read per MoE layer.
        let table: Vec<usize> = from_u32(&read(&client, table, group)?).into_iter().map(|c| c as usize).collect();
        let expected: Vec<usize> = (0..ep.size()).flat_map(|r| (0..experts).map(move |e| count(r, e))).collect();
        if table != expected {
            return Err(LowpError::distributed(format!("all-gather of counts: got {table:?}, expected {expected:?}")));
        }
        let splits = AllToAllSplits::dispatch(&sharding, ep.rank(), &table)?;
        // A row: [source EP rank, expert, index, iteration] as u32.
        let rows: Vec<u32> = (0..experts)
            .flat_map(|e| (0..count(ep.rank(), e)).flat_map(move |i| [ep.rank() as u32, e as u32, i as u32, iter as u32]))
            .collect();
        let row_bytes = 16;
        let send = client.create_from_slice(&u32_bytes(&rows).iter().copied().chain([0u8; 16]).collect::<Vec<u8>>());
        let recv = client.empty((splits.recv.iter().sum::<usize>() + 1) * row_bytes);
        ep.all_to_all(&send, AllToAllSplits::bytes(&splits.send, row_bytes)?, &recv, AllToAllSplits::bytes(&splits.recv, row_bytes)?)?;
        let back = splits.transposed();
        let returned = client.empty((back.recv.iter().sum::<usize>() + 1) * row_bytes);
        ep.all_to_all(&recv, AllToAllSplits::bytes(&back.send, row_bytes)?, &returned, AllToAllSplits::bytes(&back.recv, row_bytes)?)?;

        let received = from_u32(&read(&client, recv, group)?);
        let local = sharding.local_experts(ep.rank())?;
        let expected: Vec<u32> = (0..ep.size())
            .flat_map(|src| {
                local
                    .clone()
                    .flat_map(move |e| (0..count(src, e)).flat_map(move |i| [src as u32, e as u32, i as u32, iter as u32]))
            })
            .collect();
        if received[..expected.len()] != expected[..] {
            return Err(LowpError::distributed(format!("iteration {iter}: the dispatched rows differ from the expected")));
        }
        let returned = from_u32(&read(&client, returned, group)?);
        if returned[..rows.len()] != rows[..] {
            return Err(LowpError::distributed(format!("iteration {iter}: the combine did not return the rows sent")));
        }
    }
    check_token_exchange(group)?;
    group.check()
}

type Inner = CubeBackend<CudaRuntime, f32, i32, u8>;

/// The MoE layer's token exchange on Burn tensors: rows `[source EP rank, expert, index, 0]`
/// (f32, exact) sorted by expert go to their experts' owners; the received rows must be every
/// source's rows for this rank's experts, source-major; the loss `sum(received * (rank + 1))`
/// must give each sent row the gradient `owner + 1` back through the transposed exchange.
fn check_token_exchange(group: &ProcessGroup) -> Result<()> {
    let ep = &group.expert_parallel;
    let (me, size) = (ep.rank(), ep.size());
    let device = CudaDevice::new(group.device);
    let sharding = ExpertSharding::new(2 * size, size)?;
    let experts = sharding.num_experts;
    let count = |r: usize, e: usize| (r * 5 + e * 3) % 4;
    let exchange = DifferentiableAllToAll::<Inner>::new(Arc::new(ep.clone()));
    let exchange: &dyn TokenAllToAll<Autodiff<Inner>> = &exchange;

    let mine: Vec<i64> = (0..experts).map(|e| count(me, e) as i64).collect();
    let counts = exchange.gather_counts(Tensor::<Autodiff<Inner>, 1, Int>::from_data(TensorData::new(mine, [experts]), &device))?;
    let expected: Vec<usize> = (0..size).flat_map(|r| (0..experts).map(move |e| count(r, e))).collect();
    if counts != expected {
        return Err(LowpError::distributed(format!("token exchange counts: got {counts:?}, expected {expected:?}")));
    }
    let splits = AllToAllSplits::dispatch(&sharding, me, &counts)?;
    let row = |src: usize, e: usize, i: usize| [src as f32, e as f32, i as f32, 0.0];
    let rows: Vec<f32> = (0..experts).flat_map(|e| (0..count(me, e)).flat_map(move |i| row(me, e, i))).collect();
    let n = rows.len() / 4;
    let x = Tensor::<Autodiff<Inner>, 2>::from_data(TensorData::new(rows, [n, 4]), &device).require_grad();
    let received = exchange.all_to_all(x.clone(), &splits.send, &splits.recv)?;
    let local = sharding.local_experts(me)?;
    let expected: Vec<f32> = (0..size)
        .flat_map(|src| local.clone().flat_map(move |e| (0..count(src, e)).flat_map(move |i| row(src, e, i))))
        .collect();
    let got: Vec<f32> = received.clone().inner().into_data().convert::<f32>().into_vec().expect("f32 rows");
    if got != expected {
        return Err(LowpError::distributed(format!("token exchange: received {got:?}, expected {expected:?}")));
    }
    let grads = received.mul_scalar((me + 1) as f32).sum().backward();
    let dx: Vec<f32> = x.grad(&grads).expect("the rows' gradient").into_data().convert::<f32>().into_vec().expect("f32");
    let want: Vec<f32> = (0..experts)
        .flat_map(|e| {
            let owner = sharding.owner(e).expect("an expert") as f32;
            std::iter::repeat_n(owner + 1.0, 4 * count(me, e))
        })
        .collect();
    if dx != want {
        return Err(LowpError::distributed(format!("token exchange backward: gradient {dx:?}, expected {want:?}")));
    }
    group.check()
}

/// Reads a buffer, then the fault state: after an abort the bytes are garbage, and the fault is
/// the error to report.
fn read(client: &ComputeClient<CudaRuntime>, handle: Handle, group: &ProcessGroup) -> Result<Vec<u8>> {
    let bytes = client
        .read_one(handle)
        .map_err(|e| LowpError::distributed(format!("CubeCL read: {e:?}")))?;
    group.check()?;
    Ok(bytes.to_vec())
}

fn expect_all(what: &str, values: &[f32], expected: f32) -> Result<()> {
    match values.iter().position(|&v| v != expected) {
        None => Ok(()),
        Some(i) => Err(LowpError::distributed(format!("{what}: element {i} is {}, expected {expected}", values[i]))),
    }
}

fn f32_bytes(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

fn u32_bytes(values: &[u32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

fn from_f32(bytes: &[u8]) -> Vec<f32> {
    bytes.chunks(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
}

fn from_u32(bytes: &[u8]) -> Vec<u32> {
    bytes.chunks(4).map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
}
