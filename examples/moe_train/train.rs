//! Training an `MoeLm` under one recipe: AdamW (`optim::FusedAdamW`) with warm-up and cosine decay, micro-batches with
//! gradient accumulation and the weight cache, end-of-step scale updates, metrics as JSON lines,
//! checkpoints, a held-out evaluation at the end.
//!
//! Host synchronisation: the step itself reads nothing on the host (the grouped wgrad reads the
//! splits' pinned host copy, counted by `host_syncs`). Losses stay on the device and are read
//! together every `log_every` steps: one synchronisation per interval, which also gives honest
//! wall-clock throughput figures.

use std::collections::HashSet;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::PathBuf;
use std::time::Instant;

use burn::module::Module;
use burn::optim::{GradientsAccumulator, GradientsParams, Optimizer};
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{DType, Int, Tensor};
use burn_lowp::backend::host_sync::host_syncs;
use burn_lowp::backend::LowpBackend;
use burn_lowp::debug::{DebugConfig, DebugSession};
use burn_lowp::dist::TokenAllToAll;
use burn_lowp::error::LowpError;
use burn_lowp::moe::MoeLm;
use burn_lowp::ops::{grad_tap, LowpLinear};
use burn_lowp::optim::FusedAdamWConfig;
use burn_lowp::recipe::Recipe;
use indicatif::{ProgressBar, ProgressStyle};

use crate::checkpoint::{self, CheckpointState};
use crate::data::Corpus;
use crate::host_profile::{HostProfile, HOST_PROFILE_SKIP_STEPS};
use crate::parallel::DataParallel;
use crate::run_config::RunConfig;
use crate::summary::{DebugStepCost, HostPhases, RunSummary, StepMetrics};

/// Held-out batches evaluated at the end of a run.
const EVAL_BATCHES: usize = 8;

/// What to train and where to write.
pub struct TrainRun<'a> {
    pub config: &'a RunConfig,
    pub recipe: &'a Recipe,
    /// Label in metrics, charts and tables (e.g. the recipe file's stem).
    pub label: String,
    pub corpus: &'a Corpus,
    /// `metrics.jsonl`, checkpoints (`checkpoint/`) go here.
    pub out_dir: PathBuf,
    /// Continue from this checkpoint directory.
    pub resume: Option<PathBuf>,
    /// Stop (after checkpointing) once this step is done, as if interrupted.
    pub stop_after: Option<usize>,
    /// Write checkpoints (every `train.checkpoint_every` steps and at the end). Off for
    /// benchmark runs: a checkpoint holds the weights and both AdamW moments in f32, 22 GB for
    /// `configs/moe-1.9b.json`.
    pub checkpoints: bool,
    pub progress: bool,
    /// Bytes the device's memory pool holds, sampled at log points (peak memory).
    pub memory_probe: Option<&'a dyn Fn() -> u64>,
    /// A debug config: statistics and AutoswitchGemm logs go to `<out_dir>/debug/`.
    pub debug: Option<&'a DebugConfig>,
    /// Wait for the device after every step, timing the host's enqueueing and the wait apart
    /// (`RunSummary::sync_wait_ms_per_step`): a diagnostic of what bounds the step.
    pub sync_every_step: bool,
    /// Sample the host's CPU time over the steps after the first few and write a flame graph
    /// and a summary here (`host_profile`).
    pub host_profile: Option<PathBuf>,
}

/// Host seconds of each phase, one entry per call.
#[derive(Default)]
struct PhaseTimes {
    forward: Vec<f64>,
    backward: Vec<f64>,
    optimizer: Vec<f64>,
    debug_log: Vec<f64>,
}

/// Mean of `v[skip..]` in milliseconds (of all of `v` when nothing is left after `skip`).
fn mean_ms_from(v: &[f64], skip: usize) -> f64 {
    match v.get(skip..) {
        Some(rest) if !rest.is_empty() => 1e3 * rest.iter().sum::<f64>() / rest.len() as f64,
        _ => 1e3 * v.iter().sum::<f64>() / v.len().max(1) as f64,
    }
}

fn floats<B: burn::tensor::backend::Backend>(t: Tensor<B, 1>) -> Vec<f32> {
    t.cast(DType::F32).into_data().convert::<f32>().into_vec().expect("f32 data")
}

/// Mean held-out loss of `model`. A data parallel rank evaluates its shard of each held-out batch
/// (`TrainConfig::rank_rows`, as in training) and the shards' means are averaged over the ranks,
/// which is the global batch's mean: each rank evaluating the whole global batch would need the
/// world size times the one-GPU activation memory (a 4-rank run of the fine-grained config with
/// the one-GPU batch per rank ran out of memory there, H200, 2026-11-28).
///
/// Runs the training forward pass (on the autodiff backend, the graph dropped after each batch),
/// not `model.valid()`: on CUDA, the inference path after a training run faulted with an illegal
/// address (H100, bf16 recipe, the 235M config), not yet root-caused; the training path is
/// the one 700-step runs exercise.
fn evaluate<B>(
    model: &MoeLm<B>,
    run: &TrainRun,
    device: &B::Device,
    exchange: Option<&dyn TokenAllToAll<B>>,
    parallel: Option<&DataParallel<B>>,
) -> Result<f32, LowpError>
where
    B: AutodiffBackend + LowpLinear,
    B::InnerBackend: LowpLinear + LowpBackend,
{
    let train = &run.config.train;
    let (world_size, rank) = parallel.map_or((1, 0), |p| (p.world_size, p.rank));
    let (first_row, rows) = train.rank_rows(rank, world_size);
    let mut losses = Vec::with_capacity(EVAL_BATCHES);
    for i in 0..EVAL_BATCHES {
        let batch = run.corpus.eval_batch_rows(i, first_row, rows, train.seq_len, device);
        let out = model.forward_loss_with(batch.tokens, batch.targets, None, exchange)?;
        losses.push(out.lm_loss.detach());
    }
    let losses = Tensor::cat(losses, 0).inner();
    let all = floats(match parallel {
        Some(parallel) => parallel.average(losses)?,
        None => losses,
    });
    Ok(all.iter().sum::<f32>() / all.len() as f32)
}

fn open_metrics(run: &TrainRun) -> Result<File, LowpError> {
    let path = run.out_dir.join("metrics.jsonl");
    std::fs::create_dir_all(&run.out_dir).map_err(|e| LowpError::file(&run.out_dir, e))?;
    let mut options = OpenOptions::new();
    match run.resume {
        Some(_) => options.create(true).append(true),
        None => options.create(true).write(true).truncate(true),
    };
    options.open(&path).map_err(|e| LowpError::file(&path, e))
}

/// Trains `run.config.train.steps` steps (or from a checkpoint to there). The tests' entry; the
/// command calls `train_parallel`.
#[cfg_attr(not(test), allow(dead_code))]
pub fn train<B>(run: &TrainRun, device: &B::Device) -> Result<RunSummary, LowpError>
where
    B: AutodiffBackend + LowpLinear,
    B::InnerBackend: LowpLinear + LowpBackend,
{
    train_parallel::<B>(run, device, None)
}

/// `train` as one rank of a data (and expert) parallel run (`parallel`; `None`: the only rank).
pub fn train_parallel<B>(run: &TrainRun, device: &B::Device, parallel: Option<&DataParallel<B>>) -> Result<RunSummary, LowpError>
where
    B: AutodiffBackend + LowpLinear,
    B::InnerBackend: LowpLinear + LowpBackend,
{
    let RunConfig { model: model_config, train } = run.config;
    let (world_size, rank) = parallel.map_or((1, 0), |p| (p.world_size, p.rank));
    train.check_world_size(world_size)?;
    let writer = parallel.is_none_or(|p| p.is_writer());
    let (first_row, rank_rows) = train.rank_rows(rank, world_size);
    run.corpus.check_fits(train.seq_len)?;
    if let Some(dir) = &run.host_profile {
        HostProfile::check(dir)?;
    }
    let expert_parallel = parallel.and_then(|p| p.expert_parallel.as_ref());
    let exchange = parallel.and_then(|p| p.exchange());
    B::seed(device, train.seed);
    let mut model: MoeLm<B> = match expert_parallel {
        Some(ep) => model_config.init_expert_parallel(run.recipe, device, ep.layout.ep_size, ep.ep_rank)?,
        None => model_config.init(run.recipe, device)?,
    };
    if writer {
        print!("{}: {}", run.label, model.recipe_audit(run.recipe)?.listing());
    }
    // Burn's AdamW and per-parameter norm clipping, one kernel per parameter (`optim`).
    let mut optim = FusedAdamWConfig::new()
        .with_beta_1(train.beta1)
        .with_beta_2(train.beta2)
        .with_epsilon(train.adam_eps)
        .with_weight_decay(train.weight_decay)
        .with_grad_clip_norm(train.grad_clip_norm)
        .init::<B, MoeLm<B>>();

    let run_config_json: serde_json::Value = serde_json::from_str(&run.config.to_json()).expect("json");
    let recipe_json: serde_json::Value = serde_json::from_str(&run.recipe.to_json()).expect("json");
    let mut first_step = 0;
    if let Some(dir) = &run.resume {
        let state = checkpoint::load_state(dir)?;
        if state.run_config != run_config_json || state.recipe != recipe_json || state.seed != train.seed {
            return Err(LowpError::file(
                dir.join("state.json"),
                "the checkpoint was trained with another run config, recipe or seed; resume with the same ones",
            ));
        }
        (model, optim) = checkpoint::restore(dir, model, optim, &state, expert_parallel.map(|ep| ep.ep_rank), device)?;
        checkpoint::load_tuning(dir)?;
        first_step = state.next_step;
    }
    // An expert-parallel run's ranks write their experts' shards (those of EP group 0) and meet
    // at a barrier; rank 0 puts the checkpoint together.
    let barrier = || parallel.map_or(Ok(()), |p| p.barrier(device));
    let sharded = match expert_parallel {
        Some(ep) => Some(checkpoint::ShardedSave {
            ep_rank: ep.ep_rank,
            ep_size: ep.layout.ep_size,
            writes_shard: ep.layout.ep_group(rank)? == 0,
            writes_state: writer,
            barrier: &barrier,
        }),
        None => None,
    };
    let save = |model: &MoeLm<B>, optim: &_, next_step: usize| {
        let state = CheckpointState {
            next_step,
            seed: train.seed,
            run_config: run_config_json.clone(),
            recipe: recipe_json.clone(),
            quantize_calls: model.lowp_states().iter().map(|s| s.quantize_calls()).collect(),
        };
        let dir = run.out_dir.join("checkpoint");
        match (&sharded, writer) {
            (Some(part), _) => checkpoint::save_sharded(&dir, model, optim, &state, part),
            (None, true) => checkpoint::save(&dir, model, optim, &state),
            (None, false) => Ok(()),
        }
    };

    let num_params = model.num_params();
    let mut metrics = match writer {
        true => Some(open_metrics(run)?),
        false => None,
    };
    let bar = match run.progress && writer {
        true => ProgressBar::new(train.steps as u64),
        false => ProgressBar::hidden(),
    };
    bar.set_style(
        ProgressStyle::with_template("{prefix} [{bar:30}] {pos}/{len} {msg} ({eta})")
            .expect("template")
            .progress_chars("=> "),
    );
    bar.set_prefix(run.label.clone());
    bar.set_position(first_step as u64);

    let micro = train.micro_batches;
    let syncs_before = host_syncs();
    let mut losses = Vec::new();
    let mut pending: Vec<(usize, f64, Tensor<B, 1>, Tensor<B, 1>)> = Vec::new();
    let mut intervals: Vec<(usize, f64)> = Vec::new(); // (steps, seconds)
    let mut peak_memory = run.memory_probe.map(|probe| probe());
    let mut last_loads: Vec<Tensor<B, 1, Int>> = Vec::new();
    let last_step = run.stop_after.unwrap_or(train.steps).min(train.steps);
    // The debug session lives on this thread for the training steps (not the held-out pass).
    let debug = match run.debug {
        Some(config) => {
            let session = DebugSession::new(config.clone(), run.out_dir.join("debug"), rank)?;
            session.set_iteration(first_step as u64);
            Some(session)
        }
        None => None,
    };
    let installed = debug.as_ref().map(|s| s.install());
    let mut interval_start = Instant::now();
    // Host time in each step's code, and (sync_every_step) the wait for the GPU after it.
    let mut step_host: Vec<f64> = Vec::new();
    let mut step_wait: Vec<f64> = Vec::new();
    // With a debug config: whether each step was a sampling step (`DebugStepCost`).
    let mut step_sampled: Vec<bool> = Vec::new();
    let mut phases = PhaseTimes::default();
    let profile_from = (first_step + HOST_PROFILE_SKIP_STEPS).min(last_step.saturating_sub(1));
    let mut profile: Option<HostProfile> = None;

    // The layers' weights reduced as backward produces them (train.overlap_grad_reduce).
    let overlap = parallel.and_then(|p| p.overlap(&model));

    for step in first_step..last_step {
        if step == profile_from {
            if let Some(dir) = &run.host_profile {
                profile = Some(HostProfile::start(dir)?);
            }
        }
        let step_start = Instant::now();
        let lr = train.learning_rate(step);
        let mut accumulator = GradientsAccumulator::<MoeLm<B>>::new();
        let mut step_loss: Option<Tensor<B, 1>> = None;
        let mut step_aux: Option<Tensor<B, 1>> = None;
        let mut loads: Option<Vec<Tensor<B, 1, Int>>> = None;
        for m in 0..micro {
            let batch = run.corpus.batch_rows::<B>(train.seed, step, m, first_row, rank_rows, train.seq_len, device);
            let first = (micro > 1).then_some(m == 0);
            let phase = Instant::now();
            // Installed for the forward: the graph keeps the tap for the backward.
            let tapped = overlap.as_ref().map(|o| {
                o.reduce.start_micro_batch(m, micro);
                grad_tap::install::<B>(o.tap.clone())
            });
            let out = model.forward_loss_with(batch.tokens, batch.targets, first, exchange)?;
            drop(tapped);
            phases.forward.push(phase.elapsed().as_secs_f64());
            let phase = Instant::now();
            let grads = out.loss().div_scalar(micro as f64).backward();
            accumulator.accumulate(&model, GradientsParams::from_grads(grads, &model));
            phases.backward.push(phase.elapsed().as_secs_f64());
            let add = |acc: Option<Tensor<B, 1>>, t: Tensor<B, 1>| Some(match acc {
                Some(a) => a + t.detach(),
                None => t.detach(),
            });
            step_loss = add(step_loss, out.lm_loss.div_scalar(micro as f64));
            step_aux = add(step_aux, out.aux_loss.div_scalar(micro as f64));
            loads = Some(match loads {
                Some(sum) => sum.into_iter().zip(out.tokens_per_expert).map(|(a, b)| a + b).collect(),
                None => out.tokens_per_expert,
            });
        }
        let mut loads = loads.expect("at least one micro-batch");
        let phase = Instant::now();
        let mut grads = accumulator.grads();
        if let Some(parallel) = parallel {
            (parallel.check)()?;
            let reduced = match &overlap {
                Some(o) => o.reduce.finish(&mut grads)?,
                None => HashSet::new(),
            };
            grads = parallel.reduce_gradients(&model, grads, &reduced)?;
            parallel.reduce_amaxes(&model)?;
            loads = parallel.sum_loads(loads)?;
        }
        last_loads = loads.clone();
        model.end_step(Some(loads))?;
        model = optim.step(lr, model, grads);
        phases.optimizer.push(phase.elapsed().as_secs_f64());
        if let Some(session) = &debug {
            step_sampled.push(session.observed_this_iteration());
            let phase = Instant::now();
            session.step()?;
            phases.debug_log.push(phase.elapsed().as_secs_f64());
        }
        pending.push((step, lr, step_loss.expect("loss"), step_aux.expect("aux")));
        step_host.push(step_start.elapsed().as_secs_f64());
        if run.sync_every_step {
            let wait_start = Instant::now();
            B::sync(device).map_err(|e| {
                LowpError::invalid("device", format!("{e:?}"), "synchronizing after a step failed")
            })?;
            step_wait.push(wait_start.elapsed().as_secs_f64());
        }

        let done = step + 1;
        if done % train.log_every == 0 || done == last_step {
            // The interval's one synchronisation: its losses come to the host together.
            let (steps, lrs): (Vec<usize>, Vec<f64>) = pending.iter().map(|p| (p.0, p.1)).unzip();
            let (lm, aux): (Vec<_>, Vec<_>) = pending.drain(..).map(|p| (p.2, p.3)).unzip();
            let (lm, aux) = match parallel {
                // One all-reduce for the interval's losses: the mean over the ranks' shards is
                // the loss of the global batch.
                Some(parallel) => {
                    let n = lm.len();
                    let both = parallel.average(Tensor::cat([lm, aux].concat(), 0).inner())?;
                    let both = floats(both);
                    (both[..n].to_vec(), both[n..].to_vec())
                }
                None => (floats(Tensor::cat(lm, 0).inner()), floats(Tensor::cat(aux, 0).inner())),
            };
            let seconds = interval_start.elapsed().as_secs_f64();
            interval_start = Instant::now();
            intervals.push((steps.len(), seconds));
            let step_ms = 1e3 * seconds / steps.len() as f64;
            let tokens_per_s = (steps.len() * train.tokens_per_step()) as f64 / seconds;
            let lines = if metrics.is_some() { steps.len() } else { 0 };
            for i in 0..lines {
                let line = StepMetrics {
                    step: steps[i],
                    loss: lm[i],
                    aux_loss: aux[i],
                    lr: lrs[i],
                    step_ms,
                    tokens_per_s,
                };
                writeln!(metrics.as_mut().expect("the writer's metrics"), "{}", serde_json::to_string(&line).expect("metrics serialize"))
                    .map_err(|e| LowpError::file(run.out_dir.join("metrics.jsonl"), e))?;
            }
            losses.extend_from_slice(&lm);
            if let Some(probe) = run.memory_probe {
                peak_memory = peak_memory.max(Some(probe()));
            }
            bar.set_position(done as u64);
            bar.set_message(format!(
                "loss {:.4} | {:.0} tok/s | {:.1} ms/step",
                lm[lm.len() - 1],
                tokens_per_s,
                step_ms
            ));
            if let Some(bad) = lm.iter().find(|l| !l.is_finite()) {
                bar.abandon();
                return Err(LowpError::invalid(
                    format!("{} training loss", run.label),
                    bad,
                    format!("became non-finite by step {done}"),
                ));
            }
        }
        if run.checkpoints && train.checkpoint_every > 0 && done % train.checkpoint_every == 0 {
            save(&model, &optim, done)?;
        }
    }
    if let Some(profile) = profile {
        let dir = profile.finish(last_step - profile_from)?;
        println!("{}: host profile in {}", run.label, dir.display());
    }
    if run.checkpoints {
        save(&model, &optim, last_step)?;
    }
    bar.finish();
    if let Some(session) = &debug {
        session.finish()?;
    }
    drop(installed);
    // The held-out pass needs no optimizer state, and CubeCL's pools still hold the pages that
    // training's shapes carved: dropped and released first, so that the pass finds room (the
    // fine-grained config ran out of memory here on an 80 GB H100, 2026-11-28).
    drop(optim);
    B::memory_cleanup(device);
    let eval_loss = evaluate(&model, run, device, exchange, parallel)?;

    let ran = last_step.saturating_sub(first_step).max(1);
    let syncs = host_syncs().since(&syncs_before);
    let timed = if intervals.len() > 1 { &intervals[1..] } else { &intervals[..] };
    let (timed_steps, timed_seconds) = timed.iter().fold((0, 0.0), |(n, s), (a, b)| (n + a, s + b));
    // Per-step host and wait times over the timed steps (after the first interval).
    let skipped = if intervals.len() > 1 { intervals[0].0 } else { 0 };
    let mean_ms = |v: &[f64]| mean_ms_from(v, skipped);
    let tail = (losses.len() / 10).max(1).min(losses.len().max(1));
    let final_loss = match losses.len() {
        0 => f32::NAN,
        n => losses[n - tail..].iter().sum::<f32>() / tail as f32,
    };
    let last_loads = match last_loads.into_iter().reduce(|a, b| a + b) {
        Some(t) => t.into_data().convert::<i64>().into_vec().expect("i64 data"),
        None => Vec::new(),
    };
    Ok(RunSummary {
        label: run.label.clone(),
        num_params,
        first_step,
        steps: last_step,
        final_loss,
        eval_loss,
        losses,
        tokens_per_s: (timed_steps * train.tokens_per_step()) as f64 / timed_seconds.max(1e-9),
        step_ms: 1e3 * timed_seconds / timed_steps.max(1) as f64,
        split_reads_per_step: syncs.split_reads as f64 / ran as f64,
        blocking_split_reads_per_step: syncs.blocking_split_reads as f64 / ran as f64,
        exact_batches_per_step: syncs.exact_batches as f64 / ran as f64,
        bound_batches_per_step: syncs.bound_batches as f64 / ran as f64,
        device_grouped_batches_per_step: syncs.device_grouped_batches as f64 / ran as f64,
        device_grouped_wgrads_per_step: syncs.device_grouped_wgrads as f64 / ran as f64,
        peak_memory_bytes: peak_memory,
        last_loads,
        debug_metric_reads_per_step: syncs.debug_metric_reads as f64 / ran as f64,
        blocking_debug_metric_reads_per_step: syncs.blocking_debug_metric_reads as f64 / ran as f64,
        host_ms_per_step: mean_ms(&step_host),
        host_phase_ms_per_step: HostPhases {
            forward: micro as f64 * mean_ms_from(&phases.forward, skipped * micro),
            backward: micro as f64 * mean_ms_from(&phases.backward, skipped * micro),
            optimizer: mean_ms_from(&phases.optimizer, skipped),
            debug_log: mean_ms_from(&phases.debug_log, skipped),
        },
        sync_wait_ms_per_step: run.sync_every_step.then(|| mean_ms(&step_wait)),
        debug_step_cost: debug.as_ref().map(|_| {
            let from = skipped.min(step_host.len());
            DebugStepCost::from_steps(&step_host[from..], &step_sampled[from..])
        }),
    })
}
