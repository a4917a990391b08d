//! Timing shared by the CUDA benchmarks: the GPU time of back-to-back calls, between two timing
//! events on CubeCL's stream (as the PyTorch peers time theirs with `torch.cuda.Event`), or with
//! `LOWP_BENCH_CLOCK=wall` the wall clock between two device synchronizations.
//!
//! Why events: the wall clock also counts what a run costs once, whatever its length: the first
//! call after a synchronization waits for CubeCL's device thread to wake (about 170 µs before
//! the first launch, CUPTI trace of the quantize bench on an H100,
//! docs/measurements/2026-11-26-cupti-traces-h100.md), and the synchronization's own return. Over 20 calls of a
//! 135 µs cast that alone read as 9 µs more per call than the GPU spent. Events count from the
//! point of the stream the first call follows to the point after the last, idle time between
//! the calls included: a call that the CPU cannot enqueue fast enough still shows.

use std::sync::{Arc, Mutex};
use std::time::Instant;

use burn_lowp::backend::cuda::cublaslt::{queue_timing_mark, StreamMark};

use burn_lowp_kernels::cubecl::cuda::CudaRuntime;
use burn_lowp_kernels::cubecl::prelude::*;

pub fn sync(client: &ComputeClient<CudaRuntime>) {
    burn_lowp_kernels::cubecl::future::block_on(client.sync()).expect("device sync");
}

/// Seconds per call of `f`: after three warm-up calls (kernel compilation, algorithm choice), the
/// best of `runs` timed runs of `iterations` calls, so that a clock or power dip in one run does
/// not decide a ratio.
pub fn time(
    client: &ComputeClient<CudaRuntime>,
    iterations: usize,
    runs: usize,
    mut f: impl FnMut(),
) -> f64 {
    for _ in 0..3 {
        f();
    }
    sync(client);
    (0..runs)
        .map(|_| timed_run(client, iterations, &mut f))
        .fold(f64::INFINITY, f64::min)
}

/// The device the benchmarks run on (`CudaDevice::new(0)`).
const DEVICE: usize = 0;

fn wall_clock() -> bool {
    std::env::var("LOWP_BENCH_CLOCK").as_deref() == Ok("wall")
}

/// A timing mark queued on CubeCL's stream behind what this thread has queued.
fn timing_mark() -> Arc<Mutex<Option<StreamMark>>> {
    let slot = Arc::new(Mutex::new(None));
    queue_timing_mark(DEVICE, slot.clone());
    slot
}

/// Host seconds per call: the wall clock of `iterations` back-to-back calls before the device is
/// synchronized (what the CPU spends enqueueing; equals the time per call when the host bounds).
/// Not every bench that includes this file reports host time.
#[allow(dead_code)]
pub fn host_time(client: &ComputeClient<CudaRuntime>, iterations: usize, mut f: impl FnMut()) -> f64 {
    sync(client);
    let start = Instant::now();
    for _ in 0..iterations {
        f();
    }
    let host = start.elapsed().as_secs_f64() / iterations as f64;
    sync(client);
    host
}

/// Whether the bench takes turns with a peer process (`LOWP_BENCH_TURNS=1`, set by the peer's
/// `--turns` mode, `benches/turns.py`).
fn taking_turns() -> bool {
    std::env::var("LOWP_BENCH_TURNS").as_deref() == Ok("1")
}

/// The peer's turn before our run `run` of `case`: prints `{"turn": case, "run": run}` and waits
/// for a line on stdin, which the peer sends once it has timed its own run of the case (a closed
/// stdin means no peer). Nothing without [`taking_turns`].
fn peer_turn(case: &serde_json::Value, run: usize) {
    use std::io::{BufRead, Write};
    if !taking_turns() {
        return;
    }
    println!("{}", serde_json::json!({ "turn": case, "run": run }));
    std::io::stdout().flush().expect("stdout");
    let _ = std::io::stdin().lock().read_line(&mut String::new());
}

/// Seconds per call of one timed run of `iterations` calls: GPU time between two timing marks
/// (see the module docs), or the wall clock with `LOWP_BENCH_CLOCK=wall` or where a mark could
/// not be recorded.
fn timed_run(client: &ComputeClient<CudaRuntime>, iterations: usize, f: &mut dyn FnMut()) -> f64 {
    let wall = wall_clock();
    let start_mark = (!wall).then(timing_mark);
    let start = Instant::now();
    for _ in 0..iterations {
        f();
    }
    let end_mark = (!wall).then(timing_mark);
    sync(client);
    let wall_seconds = start.elapsed().as_secs_f64();
    let taken = |m: Option<Arc<Mutex<Option<StreamMark>>>>| m.and_then(|m| m.lock().ok()?.take());
    let gpu_seconds = match (taken(start_mark), taken(end_mark)) {
        (Some(s), Some(e)) => e.seconds_since(&s).ok(),
        _ => None,
    };
    gpu_seconds.unwrap_or(wall_seconds) / iterations as f64
}

/// Seconds per call as [`time`], taking turns with a peer process when `LOWP_BENCH_TURNS=1`
/// (`benches/turns.py` starts the bench that way): before each timed run the peer times one run
/// of the same case, so the two sides alternate run by run in the same power and thermal state
/// of the GPU. A first run on each side heats the GPU and is not counted. (Measured on an H100,
/// docs/measurements/2026-11-26-turns-h100-h200.md: BF16 GEMMs back to back pull the SM clock from 1980 down to
/// 1380-1500 MHz at the power limit within a second, and one grouped GEMM moved by up to 25 %
/// between rounds of one process; a process timed after another meets a hotter GPU, and the
/// first run after a pause a cooler one.) Without the variable it is [`time`].
#[allow(dead_code)]
pub fn time_in_turns(
    client: &ComputeClient<CudaRuntime>,
    case: &serde_json::Value,
    iterations: usize,
    runs: usize,
    mut f: impl FnMut(),
) -> f64 {
    if !taking_turns() {
        return time(client, iterations, runs, f);
    }
    for _ in 0..3 {
        f();
    }
    sync(client);
    let mut best = f64::INFINITY;
    for run in 0..=runs {
        peer_turn(case, run);
        let seconds = timed_run(client, iterations, &mut f);
        if run > 0 {
            best = best.min(seconds);
        }
    }
    best
}

/// Seconds per call of each of `cases`, timed in rounds: a round times one run of `iterations`
/// calls of every case in turn, so that the cases compared with each other (a recipe against
/// the bf16 one) meet the GPU in the same power and thermal state, not the first case a cool GPU
/// and the later ones a hot one. Round 0 heats the GPU and is not counted; the best of the next
/// `runs` rounds is kept per case. With `LOWP_BENCH_TURNS=1` the peer times its run of
/// `peer_case` before each round. Each case has run (warm-up) before.
#[allow(dead_code)]
pub fn time_rounds(
    client: &ComputeClient<CudaRuntime>,
    peer_case: &serde_json::Value,
    iterations: usize,
    runs: usize,
    cases: &mut [Box<dyn FnMut() + '_>],
) -> Vec<f64> {
    sync(client);
    let mut best = vec![f64::INFINITY; cases.len()];
    for round in 0..=runs {
        peer_turn(peer_case, round);
        for (case, f) in cases.iter_mut().enumerate() {
            let seconds = timed_run(client, iterations, f.as_mut());
            if round > 0 {
                best[case] = best[case].min(seconds);
            }
        }
    }
    best
}
