//! The training driver on NdArray (CI; `cargo test --example moe_train`): run-config errors, a
//! tiny model learning under every recipe file, checkpoint/resume reproducing the uninterrupted
//! run bit for bit, the step-sync diagnostic, and the `moe_train` command end to end (metrics,
//! chart, table, GEMM tuning files, debug configs).

use std::path::Path;

use std::sync::Arc;

use burn::backend::{Autodiff, NdArray};
use burn::tensor::Tensor;
use burn_lowp::dist::{DifferentiableAllToAll, GradReduceOptions, LoopbackAllToAll, ParallelLayout, ReduceOp, TensorAllReduce};
use burn_lowp::ops::grad_tap::{GradientSink, GradientTap, ParamTap};
use clap::Parser;

use crate::args::MoeTrainArgs;
use crate::command::{load_config, run};
use crate::data::Corpus;
use crate::run_config::RunConfig;
use crate::suite;
use crate::summary::read_summaries;
use crate::parallel::{DataParallel, ExpertParallel, OverlapParts};
use crate::train::{train, train_parallel, TrainRun};

type AD = Autodiff<NdArray>;

/// Burn's seed is process-wide (`Backend::seed` seeds one generator that every weight init
/// draws from): every test here that initializes a model holds this lock, so that a run's initial
/// weights come from its own seed alone, as in the single-run program.
static SEEDED: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn seeded() -> std::sync::MutexGuard<'static, ()> {
    SEEDED.lock().unwrap_or_else(|e| e.into_inner())
}

fn recipes_dir() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/recipes"))
}

/// A model small enough for a CPU test, yet with every GEMM dimension a multiple of 128 (MXFP8
/// and block scaling) and 128 tokens per micro-batch.
fn tiny_config(steps: usize, micro_batches: usize, score_function: &str) -> RunConfig {
    RunConfig::from_json(&format!(
        r#"{{
            "model": {{ "hidden_size": 128, "num_layers": 1, "num_heads": 2, "ffn_hidden_size": 128,
                        "num_experts": 4, "top_k": 2, "score_function": "{score_function}" }},
            "train": {{ "steps": {steps}, "batch_size": {}, "seq_len": 32, "micro_batches": {micro_batches},
                        "lr": 0.01, "warmup_steps": 2, "log_every": 2 }}
        }}"#,
        4 * micro_batches
    ))
    .unwrap()
}

fn train_run<'a>(config: &'a RunConfig, recipe: &'a burn_lowp::recipe::Recipe, corpus: &'a Corpus, out: &Path) -> TrainRun<'a> {
    TrainRun {
        config,
        recipe,
        label: "test".into(),
        corpus,
        out_dir: out.to_path_buf(),
        resume: None,
        stop_after: None,
        checkpoints: true,
        progress: false,
        memory_probe: None,
        debug: None,
        sync_every_step: false,
        host_profile: None,
    }
}

#[test]
fn run_config_errors_name_the_field_the_value_and_the_rule() {
    let cases = [
        (r#"{"model": {"num_expert": 8}}"#, "model.num_expert"),
        (r#"{"train": {"stepz": 8}}"#, "train.stepz"),
        (r#"{"model": {"hidden_size": "big"}}"#, "model.hidden_size"),
        (r#"{"model": {"top_k": 9, "num_experts": 8}}"#, "model.top_k"),
        (r#"{"model": {"hidden_size": 130, "num_heads": 4}}"#, "model.hidden_size"),
        (r#"{"train": {"batch_size": 8, "micro_batches": 3}}"#, "train.micro_batches"),
        (r#"{"train": {"steps": 0}}"#, "train.steps"),
        (r#"{"train": {"adam_eps": 0.0}}"#, "train.adam_eps"),
        (r#"{"train": {"adam_epsilon": 1e-8}}"#, "train.adam_epsilon"),
        (r#"{"trian": {}}"#, "trian"),
        ("[1, 2]", "run config"),
    ];
    for (json, names) in cases {
        let err = RunConfig::from_json(json).expect_err(json).to_string();
        assert!(err.contains(names), "{json}: {err}");
    }
    // Unknown fields list the known ones.
    let err = RunConfig::from_json(r#"{"model": {"num_expert": 8}}"#).unwrap_err().to_string();
    assert!(err.contains("num_experts"), "{err}");
    // A file names only what it changes; the rest are the defaults.
    let config = RunConfig::from_json(r#"{"model": {"num_layers": 3}}"#).unwrap();
    assert_eq!(config.model.num_layers, 3);
    assert_eq!(config.model.hidden_size, RunConfig::default().model.hidden_size);
    // AdamW's epsilon is PyTorch's unless the file sets it.
    assert_eq!(config.train.adam_eps, 1e-8);
    let config = RunConfig::from_json(r#"{"train": {"adam_eps": 1e-6}}"#).unwrap();
    assert_eq!(config.train.adam_eps, 1e-6);
    // The shipped configs load.
    for file in ["moe-tiny.json", "moe-235m.json", "moe-1.9b.json", "moe-fine-grained.json"] {
        RunConfig::load(Path::new(env!("CARGO_MANIFEST_DIR")).join("configs").join(file)).unwrap();
    }
}

#[test]
fn data_parallel_config_checks_and_shards() {
    let err = RunConfig::from_json(r#"{"train": {"expert_parallel_size": 0}}"#).unwrap_err().to_string();
    assert!(err.contains("train.expert_parallel_size"), "{err}");
    let config = RunConfig::from_json(r#"{"train": {"batch_size": 12, "micro_batches": 2}}"#).unwrap();
    assert!(config.train.grad_reduce_in_fp32);
    // 6 rows a micro-batch: 1, 2, 3 and 6 ranks divide them, 4 does not.
    for world in [1, 2, 3, 6] {
        config.train.check_world_size(world).unwrap();
    }
    let err = config.train.check_world_size(4).unwrap_err().to_string();
    assert!(err.contains("WORLD_SIZE") && err.contains("4") && err.contains("train.batch_size 12"), "{err}");
    assert_eq!(config.train.rank_rows(2, 3), (4, 2));
    // The ranks' shards, in rank order, are the one-GPU micro-batch row for row.
    let corpus = Corpus::built_in(1 << 16);
    let device = Default::default();
    let whole = corpus.batch::<NdArray>(7, 3, 1, 6, 16, &device);
    let shards: Vec<_> = (0..3)
        .map(|rank| {
            let (first, rows) = config.train.rank_rows(rank, 3);
            corpus.batch_rows::<NdArray>(7, 3, 1, first, rows, 16, &device).tokens
        })
        .collect();
    let joined = burn::tensor::Tensor::cat(shards, 0);
    assert_eq!(joined.into_data(), whole.tokens.into_data());
}

#[test]
fn expert_parallel_config_checks() {
    // expert_parallel_size must divide num_experts (each rank an equal block) ...
    let err = RunConfig::from_json(r#"{"model": {"num_experts": 6}, "train": {"expert_parallel_size": 4}}"#)
        .unwrap_err()
        .to_string();
    assert!(err.contains("train.expert_parallel_size = 4") && err.contains("model.num_experts = 6"), "{err}");
    // ... and the world size (groups of consecutive ranks); a one-GPU run takes 1.
    let config = RunConfig::from_json(r#"{"model": {"num_experts": 8}, "train": {"expert_parallel_size": 4, "batch_size": 24}}"#).unwrap();
    config.train.check_world_size(4).unwrap();
    config.train.check_world_size(8).unwrap();
    for world in [1, 2, 6] {
        let err = config.train.check_world_size(world).unwrap_err().to_string();
        assert!(err.contains("train.expert_parallel_size = 4") && err.contains(&format!("world size {world}")), "{err}");
    }
    // --expert-parallel-size overrides the file, through the same checks.
    let config = load_config(&MoeTrainArgs::parse_from(["moe_train", "--expert-parallel-size", "2"])).unwrap();
    assert_eq!(config.train.expert_parallel_size, 2);
    assert_eq!(config.to_json().replace("\"expert_parallel_size\": 2", "\"expert_parallel_size\": 1"), RunConfig::default().to_json());
    let err = load_config(&MoeTrainArgs::parse_from(["moe_train", "--expert-parallel-size", "3"])).unwrap_err().to_string();
    assert!(err.contains("model.num_experts = 8"), "{err}");
}

/// The all-reduce of a one-rank group: the values themselves.
struct OneRank;

impl TensorAllReduce<NdArray> for OneRank {
    fn all_reduce(&self, tensor: Tensor<NdArray, 1>, _: ReduceOp) -> burn_lowp::error::Result<Tensor<NdArray, 1>> {
        Ok(tensor)
    }
}

/// `OneRank` counting the all-reduces queued unjoined (the overlapped reduction's).
#[derive(Default)]
struct CountingOneRank {
    unjoined: std::sync::atomic::AtomicUsize,
}

impl CountingOneRank {
    fn unjoined(&self) -> usize {
        self.unjoined.load(std::sync::atomic::Ordering::SeqCst)
    }
}

impl TensorAllReduce<NdArray> for CountingOneRank {
    fn all_reduce(&self, tensor: Tensor<NdArray, 1>, _: ReduceOp) -> burn_lowp::error::Result<Tensor<NdArray, 1>> {
        Ok(tensor)
    }

    fn all_reduce_unjoined(&self, tensor: Tensor<NdArray, 1>, op: ReduceOp) -> burn_lowp::error::Result<Tensor<NdArray, 1>> {
        self.unjoined.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        self.all_reduce(tensor, op)
    }
}

/// A one-rank data parallel run (every all-reduce the identity): expert parallel over the
/// loopback `exchange` when given, the reduction overlapped with backward when `overlap` is.
fn one_rank<'a>(exchange: Option<&'a DifferentiableAllToAll<NdArray>>, overlap: Option<OverlapParts<'a, AD>>) -> DataParallel<'a, AD> {
    DataParallel {
        rank: 0,
        world_size: 1,
        reducer: &OneRank,
        check: &|| Ok(()),
        grad_reduce: GradReduceOptions::default(),
        expert_parallel: exchange.map(|exchange| ExpertParallel {
            layout: ParallelLayout::new(1, 1).unwrap(),
            ep_rank: 0,
            exchange,
            expert_reducer: &OneRank,
        }),
        overlap,
    }
}

/// The training loop through the expert-parallel code (a one-rank EP group: the loopback
/// exchange, the experts' and the other gradients reduced apart, the amaxes per group) trains as
/// the plain loop does; and its checkpoint, sharded by EP rank, resumes it bit for bit.
#[test]
fn training_through_the_expert_parallel_path_on_one_rank_equals_the_plain_run() {
    let _seeded = seeded();
    let device = Default::default();
    let corpus = Corpus::built_in(1 << 16);
    let config = tiny_config(6, 2, "sigmoid");
    let exchange = DifferentiableAllToAll::<NdArray>::new(Arc::new(LoopbackAllToAll));
    let parallel = one_rank(Some(&exchange), None);
    for name in ["bf16.json", "delayed_scaling.json"] {
        let recipe = suite::recipe(name);
        let out = tempfile::tempdir().unwrap();
        let run = TrainRun {
            checkpoints: false,
            ..train_run(&config, &recipe, &corpus, out.path())
        };
        let plain = train::<AD>(&run, &device).unwrap();
        let ep = train_parallel::<AD>(&run, &device, Some(&parallel)).unwrap();
        assert_eq!(ep.losses.len(), plain.losses.len());
        for (step, (a, b)) in plain.losses.iter().zip(&ep.losses).enumerate() {
            assert!((a - b).abs() <= 1e-5 * a.abs(), "{name} step {step}: plain {a}, expert-parallel {b}");
        }
        assert!((plain.eval_loss - ep.eval_loss).abs() <= 1e-5 * plain.eval_loss.abs(), "{name}: held-out loss");
    }
    let recipe = suite::recipe("delayed_scaling.json");
    let whole = tempfile::tempdir().unwrap();
    let uninterrupted = train_parallel::<AD>(&train_run(&config, &recipe, &corpus, whole.path()), &device, Some(&parallel)).unwrap();
    let parts = tempfile::tempdir().unwrap();
    let first = TrainRun {
        stop_after: Some(3),
        ..train_run(&config, &recipe, &corpus, parts.path())
    };
    train_parallel::<AD>(&first, &device, Some(&parallel)).unwrap();
    let checkpoint = parts.path().join("checkpoint");
    assert!(checkpoint.join("ep-rank-0").join("model.bin").is_file(), "EP rank 0's records in their directory");
    assert!(checkpoint.join("state.json").is_file() && !checkpoint.join("model.bin").exists());
    let resumed = TrainRun {
        resume: Some(checkpoint.clone()),
        ..train_run(&config, &recipe, &corpus, parts.path())
    };
    let resumed = train_parallel::<AD>(&resumed, &device, Some(&parallel)).unwrap();
    let bits = |l: &[f32]| l.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&resumed.losses), bits(&uninterrupted.losses[3..]), "resumed losses");
    // The plain loop cannot take the sharded checkpoint: its config differs (expert_parallel_size
    // is the same here, so the records' place is what tells), and the error names the file.
    let err = train::<AD>(
        &TrainRun {
            resume: Some(checkpoint),
            ..train_run(&config, &recipe, &corpus, parts.path())
        },
        &device,
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("model.bin") && err.contains("expert parallelism"), "{err}");
}

/// The reduction overlapped with backward (the layers' weights through the gradient tap,
/// summed over two micro-batches, reduced in the last one's backward, the rest after backward)
/// trains exactly as the reduction after backward, with and without expert parallelism (one
/// rank: the all-reduce is the identity, so what is tested is which gradient each parameter
/// ends with, and that each is reduced once: `OverlappedGradReduce::finish` fails on a
/// gradient both tapped and left in the graph).
#[test]
fn the_overlapped_gradient_reduction_trains_as_the_reduction_after_backward() {
    let _seeded = seeded();
    let device = Default::default();
    let corpus = Corpus::built_in(1 << 16);
    let config = tiny_config(4, 2, "softmax");
    let exchange = DifferentiableAllToAll::<NdArray>::new(Arc::new(LoopbackAllToAll));
    let make_tap = |sink: GradientSink<NdArray>| Arc::new(GradientTap::<NdArray>::new(sink)) as Arc<dyn ParamTap<AD>>;
    let (world, experts) = (Arc::new(CountingOneRank::default()), Arc::new(CountingOneRank::default()));
    let parallel = |expert_parallel: bool, overlap: bool| {
        let overlap = overlap.then(|| OverlapParts {
            world: world.clone(),
            experts: expert_parallel.then(|| experts.clone() as Arc<dyn TensorAllReduce<NdArray> + Send + Sync>),
            tap: &make_tap,
        });
        one_rank(expert_parallel.then_some(&exchange), overlap)
    };
    let bits = |l: &[f32]| l.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    for name in ["bf16.json", "delayed_scaling.json"] {
        let recipe = suite::recipe(name);
        for ep in [false, true] {
            let out = tempfile::tempdir().unwrap();
            let run = TrainRun {
                checkpoints: false,
                ..train_run(&config, &recipe, &corpus, out.path())
            };
            let after = train_parallel::<AD>(&run, &device, Some(&parallel(ep, false))).unwrap();
            let (world_before, experts_before) = (world.unjoined(), experts.unjoined());
            let overlapped = train_parallel::<AD>(&run, &device, Some(&parallel(ep, true))).unwrap();
            // Five tapped weights (attention's qkv and proj, the LM head, the experts' fc1 and
            // fc2), one reduction each a step whatever the micro-batches; the experts' over
            // their own group under expert parallelism.
            let (dense, expert) = (world.unjoined() - world_before, experts.unjoined() - experts_before);
            let steps = config.train.steps;
            match ep {
                false => assert_eq!((dense, expert), (5 * steps, 0), "{name}: reductions in backward"),
                true => assert_eq!((dense, expert), (3 * steps, 2 * steps), "{name}: reductions in backward"),
            }
            assert_eq!(bits(&overlapped.losses), bits(&after.losses), "{name}, expert parallel {ep}: losses");
            assert_eq!(overlapped.eval_loss.to_bits(), after.eval_loss.to_bits(), "{name}, expert parallel {ep}: held-out loss");
        }
    }
}

/// A tiny model's training loss falls under every recipe file (40 steps of the built-in corpus);
/// byte-level text starts at ln 256 = 5.55.
#[test]
fn a_tiny_model_learns_under_every_recipe_file() {
    let _seeded = seeded();
    let device = Default::default();
    let corpus = Corpus::built_in(1 << 16);
    let config = tiny_config(40, 1, "softmax");
    let out = tempfile::tempdir().unwrap();
    let mut failures = Vec::new();
    for name in suite::RECIPES {
        let recipe = suite::recipe(name);
        let summary = train::<AD>(&train_run(&config, &recipe, &corpus, out.path()), &device).unwrap();
        let first = summary.losses[..4].iter().sum::<f32>() / 4.0;
        let last = summary.losses[36..].iter().sum::<f32>() / 4.0;
        println!("{name}: {first:.4} -> {last:.4} (held-out {:.4})", summary.eval_loss);
        // Measured: from about 5.5 to about 3 under every recipe in 40 steps; a model that does
        // not learn stays near 5.5.
        if !(last < 0.8 * first) || !summary.eval_loss.is_finite() {
            failures.push(format!("{name}: loss {first} -> {last}, held-out {}", summary.eval_loss));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Stopping after 3 steps and resuming from the checkpoint gives the uninterrupted run's next
/// losses bit for bit: the model, AdamW's moments, the delayed-scaling histories, the
/// stochastic-rounding stream (NVFP4), the routers' aux-loss-free biases (sigmoid routing) and the
/// data position all come back. Two micro-batches, so the weight cache and gradient accumulation
/// are part of it.
#[test]
fn resuming_from_a_checkpoint_reproduces_the_uninterrupted_losses_bit_for_bit() {
    let _seeded = seeded();
    let device = Default::default();
    let corpus = Corpus::built_in(1 << 16);
    let config = tiny_config(6, 2, "sigmoid");
    for name in ["bf16.json", "delayed_scaling.json", "nvfp4.json"] {
        let recipe = suite::recipe(name);
        let whole = tempfile::tempdir().unwrap();
        let uninterrupted = train::<AD>(&train_run(&config, &recipe, &corpus, whole.path()), &device).unwrap();
        assert_eq!(uninterrupted.losses.len(), 6);

        let parts = tempfile::tempdir().unwrap();
        let first = train::<AD>(
            &TrainRun {
                stop_after: Some(3),
                ..train_run(&config, &recipe, &corpus, parts.path())
            },
            &device,
        )
        .unwrap();
        assert_eq!(first.losses, uninterrupted.losses[..3], "{name}: the first half");
        let resumed = train::<AD>(
            &TrainRun {
                resume: Some(parts.path().join("checkpoint")),
                ..train_run(&config, &recipe, &corpus, parts.path())
            },
            &device,
        )
        .unwrap();
        assert_eq!(resumed.first_step, 3);
        let bits = |l: &[f32]| l.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&resumed.losses), bits(&uninterrupted.losses[3..]), "{name}: resumed losses");
        assert_eq!(resumed.eval_loss.to_bits(), uninterrupted.eval_loss.to_bits(), "{name}: held-out loss");
        // The metrics file holds all six steps once.
        let lines = std::fs::read_to_string(parts.path().join("metrics.jsonl")).unwrap();
        assert_eq!(lines.lines().count(), 6, "{name}");

        // Resuming under another recipe is refused, naming the checkpoint.
        let other = suite::recipe("mxfp8.json");
        let err = train::<AD>(
            &TrainRun {
                resume: Some(parts.path().join("checkpoint")),
                ..train_run(&config, &other, &corpus, parts.path())
            },
            &device,
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("checkpoint") && err.contains("recipe"), "{err}");
    }
}

/// The step-bound diagnostic (`sync_every_step`) waits for the device after each step and
/// reports the wait; it changes no number of the training. Without checkpoints (a benchmark run,
/// `--no-checkpoint`) nothing is written to `checkpoint/`, and the losses are the same.
#[test]
fn syncing_after_every_step_reports_the_wait_and_changes_no_loss() {
    let _seeded = seeded();
    let device = Default::default();
    let corpus = Corpus::built_in(1 << 16);
    let config = tiny_config(4, 2, "softmax");
    let recipe = suite::recipe("current_scaling.json");
    let plain_dir = tempfile::tempdir().unwrap();
    let plain = train::<AD>(&train_run(&config, &recipe, &corpus, plain_dir.path()), &device).unwrap();
    let synced_dir = tempfile::tempdir().unwrap();
    let synced = train::<AD>(
        &TrainRun {
            sync_every_step: true,
            checkpoints: false,
            ..train_run(&config, &recipe, &corpus, synced_dir.path())
        },
        &device,
    )
    .unwrap();
    let bits = |l: &[f32]| l.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&synced.losses), bits(&plain.losses));
    assert!(plain_dir.path().join("checkpoint").join("state.json").exists(), "the default run checkpoints");
    assert!(!synced_dir.path().join("checkpoint").exists(), "a run without checkpoints wrote one");
    assert!(!synced_dir.path().join("checkpoint.saving").exists(), "a run without checkpoints began one");
    assert_eq!(plain.sync_wait_ms_per_step, None);
    let wait = synced.sync_wait_ms_per_step.expect("a wait per step");
    assert!(wait >= 0.0 && wait.is_finite(), "{wait}");
    assert!(synced.host_ms_per_step > 0.0 && plain.host_ms_per_step > 0.0);
    // The phases are parts of the step's host time.
    let p = &synced.host_phase_ms_per_step;
    assert!(p.forward > 0.0 && p.backward > 0.0 && p.optimizer > 0.0, "{p:?}");
    let parts = p.forward + p.backward + p.optimizer;
    assert!(parts <= synced.host_ms_per_step * (1.0 + 1e-9), "{parts} > {}", synced.host_ms_per_step);
}

/// `--host-profile` in a build without the sampler is refused before the first step.
#[cfg(not(feature = "host-profile"))]
#[test]
fn a_host_profile_without_the_feature_is_a_clear_error_before_training() {
    let device = Default::default();
    let corpus = Corpus::built_in(1 << 16);
    let config = tiny_config(4, 1, "softmax");
    let recipe = suite::recipe("bf16.json");
    let dir = tempfile::tempdir().unwrap();
    let err = train::<AD>(
        &TrainRun {
            host_profile: Some(dir.path().join("profile")),
            ..train_run(&config, &recipe, &corpus, dir.path())
        },
        &device,
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("--host-profile") && err.contains("--features host-profile"), "{err}");
    assert!(!dir.path().join("metrics.jsonl").exists(), "training started: {err}");
}

/// `moe_train --compare` end to end on the CPU: every run's metrics, the chart, the table; then
/// `--report` redraws them from the runs on disk.
#[test]
fn the_moe_train_command_writes_metrics_a_chart_and_a_table() {
    let _seeded = seeded();
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("tiny.json");
    std::fs::write(&config, tiny_config(4, 1, "softmax").to_json()).unwrap();
    let out = dir.path().join("runs");
    let args = MoeTrainArgs::try_parse_from([
        "moe_train".as_ref(),
        "--compare".as_ref(),
        recipes_dir().join("bf16.json").as_os_str(),
        recipes_dir().join("mxfp8.json").as_os_str(),
        "--config".as_ref(),
        config.as_os_str(),
        "--out".as_ref(),
        out.as_os_str(),
        "--quiet".as_ref(),
    ])
    .unwrap();
    let summaries = run::<AD>(&args, &Default::default(), None).unwrap();
    assert_eq!(summaries.len(), 2);
    for label in ["bf16", "mxfp8"] {
        let metrics = std::fs::read_to_string(out.join(label).join("metrics.jsonl")).unwrap();
        let lines: Vec<serde_json::Value> = metrics.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
        assert_eq!(lines.len(), 4, "{label}");
        for (step, line) in lines.iter().enumerate() {
            assert_eq!(line["step"], step, "{label}");
            assert!(line["loss"].as_f64().unwrap().is_finite(), "{label}");
            assert!(line["tokens_per_s"].as_f64().unwrap() > 0.0, "{label}");
        }
        assert!(out.join(label).join("checkpoint").join("state.json").is_file());
    }
    let png = std::fs::read(out.join("loss.png")).unwrap();
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
    assert!(png.len() > 10_000, "a chart with curves and text, not an empty image");
    let table = std::fs::read_to_string(out.join("results.md")).unwrap();
    assert!(table.contains("| bf16 |") && table.contains("| mxfp8 |"), "{table}");
    assert!(table.contains("1.00x"), "bf16 is the base: {table}");

    // --report rebuilds them from the runs' summaries, bf16 first.
    std::fs::remove_file(out.join("loss.png")).unwrap();
    let report = MoeTrainArgs::try_parse_from(["moe_train".as_ref(), "--report".as_ref(), "--out".as_ref(), out.as_os_str()]).unwrap();
    let again = run::<AD>(&report, &Default::default(), None).unwrap();
    assert_eq!(again.iter().map(|s| s.label.as_str()).collect::<Vec<_>>(), ["bf16", "mxfp8"]);
    assert_eq!(again[1].losses, summaries[1].losses);
    assert!(out.join("loss.png").is_file());
    assert_eq!(read_summaries(&out).unwrap().len(), 2);

    // --explain-recipe builds the model, lists the assignments and trains nothing.
    let explained = dir.path().join("explained");
    let explain = MoeTrainArgs::try_parse_from([
        "moe_train".as_ref(),
        "--explain-recipe".as_ref(),
        "--recipe".as_ref(),
        recipes_dir().join("mxfp8.json").as_os_str(),
        "--config".as_ref(),
        config.as_os_str(),
        "--out".as_ref(),
        explained.as_os_str(),
    ])
    .unwrap();
    assert!(run::<AD>(&explain, &Default::default(), None).unwrap().is_empty());
    assert!(!explained.join("mxfp8").exists(), "nothing trained");

    // Bad input is an error naming it, before anything trains.
    let missing = dir.path().join("none.json");
    let args = MoeTrainArgs::try_parse_from([
        "moe_train".as_ref(),
        "--recipe".as_ref(),
        missing.as_os_str(),
        "--out".as_ref(),
        out.as_os_str(),
    ])
    .unwrap();
    let err = run::<AD>(&args, &Default::default(), None).unwrap_err().to_string();
    assert!(err.contains("none.json"), "{err}");
    let bad = dir.path().join("bad.json");
    std::fs::write(&bad, r#"{"model": {"top_k": 0}}"#).unwrap();
    let args = MoeTrainArgs::try_parse_from(["moe_train".as_ref(), "--config".as_ref(), bad.as_os_str()]).unwrap();
    let err = run::<AD>(&args, &Default::default(), None).unwrap_err().to_string();
    assert!(err.contains("model.top_k"), "{err}");
    // --compare and --recipe together are a usage error.
    assert!(MoeTrainArgs::try_parse_from(["moe_train", "--recipe", "a.json", "--compare", "b.json"]).is_err());
}

/// `--gemm-tuning FILE`: a missing file is created after training, an existing one is loaded
/// before it (a malformed one is an error naming it, before anything trains); every run and
/// checkpoint keeps its `gemm-tuning.json`, which loads back.
#[test]
fn the_moe_train_command_keeps_gemm_tuning_files() {
    use burn_lowp::backend::load_gemm_tuning;
    let _seeded = seeded();
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("tiny.json");
    std::fs::write(&config, tiny_config(2, 1, "softmax").to_json()).unwrap();
    let out = dir.path().join("runs");
    let tuning = dir.path().join("tuning.json");
    let args = |tuning: &Path| {
        MoeTrainArgs::try_parse_from([
            "moe_train".as_ref(),
            "--config".as_ref(),
            config.as_os_str(),
            "--out".as_ref(),
            out.as_os_str(),
            "--gemm-tuning".as_ref(),
            tuning.as_os_str(),
            "--quiet".as_ref(),
        ])
        .unwrap()
    };
    run::<AD>(&args(&tuning), &Default::default(), None).unwrap();
    for file in [
        tuning.clone(),
        out.join("bf16").join("gemm-tuning.json"),
        out.join("bf16").join("checkpoint").join("gemm-tuning.json"),
    ] {
        assert!(load_gemm_tuning(&file).is_ok(), "{} does not load back", file.display());
    }
    // The file now exists: the next run loads it and trains.
    run::<AD>(&args(&tuning), &Default::default(), None).unwrap();

    let bad = dir.path().join("bad-tuning.json");
    std::fs::write(&bad, "{\"format\": \"mine\", \"algorithms\": {}}").unwrap();
    let fresh = dir.path().join("fresh");
    let err = run::<AD>(
        &MoeTrainArgs::try_parse_from([
            "moe_train".as_ref(),
            "--config".as_ref(),
            config.as_os_str(),
            "--out".as_ref(),
            fresh.as_os_str(),
            "--gemm-tuning".as_ref(),
            bad.as_os_str(),
        ])
        .unwrap(),
        &Default::default(),
        None,
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("bad-tuning.json") && err.contains("mine"), "{err}");
    assert!(!fresh.join("bf16").join("metrics.jsonl").exists(), "training started: {err}");
}

/// `--debug-config`: the shipped debug config runs with the example (statistics of the experts
/// per expert, AutoswitchGemm samples), its logs parse into the switch summary, and a bad debug
/// config is an error before anything trains.
#[test]
fn the_moe_train_command_takes_a_debug_config() {
    let _seeded = seeded();
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("tiny.json");
    std::fs::write(&config, tiny_config(3, 1, "softmax").to_json()).unwrap();
    let debug = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/configs/debug/moe.json"));
    // Sample every step rather than every tenth.
    let text = std::fs::read_to_string(debug).unwrap().replace("\"freq\": 10", "\"freq\": 1");
    let debug = dir.path().join("debug.json");
    std::fs::write(&debug, text).unwrap();
    let out = dir.path().join("runs");
    let args = MoeTrainArgs::try_parse_from([
        "moe_train".as_ref(),
        "--recipe".as_ref(),
        recipes_dir().join("current_scaling.json").as_os_str(),
        "--config".as_ref(),
        config.as_os_str(),
        "--debug-config".as_ref(),
        debug.as_os_str(),
        "--out".as_ref(),
        out.as_os_str(),
        "--quiet".as_ref(),
    ])
    .unwrap();
    let summaries = run::<AD>(&args, &Default::default(), None).unwrap();
    assert!(summaries[0].debug_metric_reads_per_step > 0.0);
    // Every step samples (freq 1), so no step is clean and there is no in-run overhead figure.
    let cost = summaries[0].debug_step_cost.as_ref().expect("a debug run measures its cost");
    assert!(cost.sampled_steps >= 1 && cost.clean_steps == 0 && cost.overhead.is_none(), "{cost:?}");
    let logs = out.join("current_scaling").join("debug");
    let summary = burn_lowp::debug::DebugSummary::read(&logs).unwrap();
    let expert_fprops: Vec<_> = summary
        .gemms
        .iter()
        .filter(|((layer, gemm), _)| layer.starts_with("layers.0.moe.experts.fc1.gemm_") && gemm == "fprop")
        .collect();
    assert!(!expert_fprops.is_empty(), "per-expert samples: {:?}", summary.gemms.keys());
    assert!(expert_fprops.iter().all(|(_, g)| g.samples >= 1 && g.samples <= 3));
    let stats = std::fs::read_to_string(logs.join("debug_stats-rank0.jsonl")).unwrap();
    let iterations: std::collections::BTreeSet<u64> = stats
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["iteration"].as_u64().unwrap())
        .collect();
    assert_eq!(iterations.into_iter().collect::<Vec<_>>(), [0, 1, 2]);
    assert!(stats.contains("\"layers.0.attention.qkv\"") && stats.contains("\"underflows%_columnwise\""));

    std::fs::write(&debug, r#"{ "s": { "layers": { "layer_types": ["linear"] }, "features": { "AutoswitchGemm": { "freq": 0 } } } }"#).unwrap();
    let err = run::<AD>(&args, &Default::default(), None).unwrap_err().to_string();
    assert!(err.contains("debug.json") && err.contains("freq"), "{err}");
}
