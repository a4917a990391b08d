//! The `moe_train` command (`main.rs` picks the backend and calls [`run`]): one recipe, or
//! `--compare` several under the same seed and data, with the loss-curve chart and a results
//! table.

use std::path::Path;

use burn::tensor::backend::AutodiffBackend;
use burn_lowp::backend::{load_gemm_tuning, save_gemm_tuning, LowpBackend};
use burn_lowp::debug::{DebugConfig, DebugSummary};
use burn_lowp::error::LowpError;
use burn_lowp::ops::LowpLinear;
use burn_lowp::recipe::Recipe;

use crate::args::MoeTrainArgs;
use crate::data::Corpus;
use crate::plot::{loss_curves, smooth, Curve};
use crate::run_config::RunConfig;
use crate::summary::{read_summaries, results_table, RunSummary};
use crate::parallel::DataParallel;
use crate::train::{train_parallel, TrainRun};

/// Bytes of the built-in corpus.
const BUILT_IN_CORPUS: usize = 4 << 20;

fn label(path: &Path) -> String {
    path.file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| path.display().to_string())
}

/// Runs the command on backend `B`; returns every run's summary (also written to
/// `<out>/summary.json`, `<out>/results.md` and drawn in `<out>/loss.png`).
pub fn run<B>(args: &MoeTrainArgs, device: &B::Device, memory_probe: Option<&dyn Fn() -> u64>) -> Result<Vec<RunSummary>, LowpError>
where
    B: AutodiffBackend + LowpLinear,
    B::InnerBackend: LowpLinear + LowpBackend,
{
    run_parallel::<B>(args, device, memory_probe, None)
}

/// The run config of the command line: the file (or the defaults), `--steps` and
/// `--expert-parallel-size` applied.
pub fn load_config(args: &MoeTrainArgs) -> Result<RunConfig, LowpError> {
    let mut config = match &args.config {
        Some(path) => RunConfig::load(path)?,
        None => RunConfig::default(),
    };
    if let Some(steps) = args.steps {
        if steps == 0 {
            return Err(LowpError::invalid("--steps", steps, "must be positive"));
        }
        config.train.steps = steps;
    }
    if let Some(ep) = args.expert_parallel_size {
        let mut given = serde_json::from_str::<serde_json::Value>(&config.to_json()).expect("a run config is JSON");
        given["train"]["expert_parallel_size"] = ep.into();
        // Through the file's checks again: ep must divide num_experts.
        config = RunConfig::from_json(&given.to_string())?;
    }
    Ok(config)
}

/// The recipes of the command line, each read and validated, with their labels.
pub fn load_recipes(args: &MoeTrainArgs) -> Result<Vec<(String, Recipe)>, LowpError> {
    match (&args.recipe, args.compare.is_empty()) {
        (_, false) => args
            .compare
            .iter()
            .map(|p| Ok((label(p), Recipe::load(p)?)))
            .collect::<Result<_, LowpError>>(),
        (Some(path), true) => Ok(vec![(label(path), Recipe::load(path)?)]),
        (None, true) => Ok(vec![("bf16".into(), Recipe::from_json(r#"{"recipe": "bf16"}"#)?)]),
    }
}

/// `run` as one rank of a data (and expert) parallel run (`parallel`; `None`: the only rank). Rank 0 alone
/// writes the summaries, tables, charts and GEMM tuning files.
pub fn run_parallel<B>(
    args: &MoeTrainArgs,
    device: &B::Device,
    memory_probe: Option<&dyn Fn() -> u64>,
    parallel: Option<&DataParallel<B>>,
) -> Result<Vec<RunSummary>, LowpError>
where
    B: AutodiffBackend + LowpLinear,
    B::InnerBackend: LowpLinear + LowpBackend,
{
    let writer = parallel.is_none_or(|p| p.is_writer());
    if args.report {
        let summaries = read_summaries(&args.out)?;
        write_report(&args.out, &summaries)?;
        return Ok(summaries);
    }
    let config = load_config(args)?;
    let corpus = match &args.data {
        Some(path) => Corpus::from_file(path)?,
        None => Corpus::built_in(BUILT_IN_CORPUS),
    };
    corpus.check_fits(config.train.seq_len)?;
    // Every recipe file is read and validated before anything trains.
    let recipes = load_recipes(args)?;
    let debug = args.debug_config.as_ref().map(DebugConfig::load).transpose()?;
    if let Some(path) = args.gemm_tuning.as_ref().filter(|p| p.exists()) {
        let count = load_gemm_tuning(path)?;
        println!("GEMM tuning: {count} algorithm choices from {}", path.display());
    }
    if args.explain_recipe {
        for (name, recipe) in &recipes {
            let model: burn_lowp::moe::MoeLm<B> = config.model.init(recipe, device)?;
            print!("{name}: {}", model.recipe_audit(recipe)?.listing());
        }
        return Ok(Vec::new());
    }
    let mut labels: Vec<&str> = recipes.iter().map(|r| r.0.as_str()).collect();
    labels.sort();
    labels.dedup();
    if labels.len() != recipes.len() {
        return Err(LowpError::invalid("--compare", "recipe names", "each recipe file needs its own file name"));
    }
    if writer {
        std::fs::create_dir_all(&args.out).map_err(|e| LowpError::file(&args.out, e))?;
    }
    println!(
        "model: {} layers, hidden {}, {} experts (top-{}), data: {} ({} bytes), {} tokens/step",
        config.model.num_layers,
        config.model.hidden_size,
        config.model.num_experts,
        config.model.top_k,
        corpus.source,
        corpus.len(),
        config.train.tokens_per_step()
    );
    let mut summaries = Vec::new();
    for (name, recipe) in &recipes {
        let summary = train_parallel::<B>(
            &TrainRun {
                config: &config,
                recipe,
                label: name.clone(),
                corpus: &corpus,
                out_dir: args.out.join(name),
                resume: args.resume.clone(),
                stop_after: args.stop_after,
                checkpoints: !args.no_checkpoint,
                progress: !args.quiet,
                memory_probe,
                debug: debug.as_ref(),
                sync_every_step: args.sync_every_step,
                host_profile: args.host_profile.as_ref().map(|dir| dir.join(name)),
            },
            device,
            parallel,
        )?;
        if !writer {
            summaries.push(summary);
            continue;
        }
        if debug.is_some() {
            let dir = args.out.join(name).join("debug");
            println!(
                "{name}: debug logs in {} ({:.2} AutoswitchGemm metric reads per step, {:.2} of them waited for the GPU; `lowp debug-summary` for the statistics)\n{}",
                dir.display(),
                summary.debug_metric_reads_per_step,
                summary.blocking_debug_metric_reads_per_step,
                DebugSummary::read(&dir)?.switch_table()
            );
            if let Some(cost) = &summary.debug_step_cost {
                println!(
                    "{name}: debug cost inside the run: {} sampling steps at {:.1} ms host, the steps after them at {:.1} ms, {} clean steps at {:.1} ms: overhead {}",
                    cost.sampled_steps,
                    cost.sampled_host_ms,
                    cost.after_sampled_host_ms,
                    cost.clean_steps,
                    cost.clean_host_ms,
                    cost.overhead.map_or("n/a (no clean step)".to_string(), |o| format!("{:.1} %", 100.0 * o))
                );
            }
        }
        let path = args.out.join(name).join("summary.json");
        let json = serde_json::to_string_pretty(&summary).expect("summary serializes");
        std::fs::write(&path, json).map_err(|e| LowpError::file(&path, e))?;
        save_gemm_tuning(args.out.join(name).join("gemm-tuning.json"))?;
        println!(
            "{}: {} parameters, final loss {:.4}, held-out {:.4}, {:.0} tokens/s",
            name, summary.num_params, summary.final_loss, summary.eval_loss, summary.tokens_per_s
        );
        if let Some(wait) = summary.sync_wait_ms_per_step {
            println!(
                "{name}: the host spent {:.1} ms per step in the step's code (forward {:.1}, backward {:.1}, optimizer {:.1}, debug log {:.1}), then waited {:.1} ms for the GPU ({})",
                summary.host_ms_per_step,
                summary.host_phase_ms_per_step.forward,
                summary.host_phase_ms_per_step.backward,
                summary.host_phase_ms_per_step.optimizer,
                summary.host_phase_ms_per_step.debug_log,
                wait,
                if wait < 0.1 * summary.host_ms_per_step { "host-bound" } else { "the GPU takes longer than the host" }
            );
        }
        summaries.push(summary);
    }

    if !writer {
        return Ok(summaries);
    }
    if let Some(path) = &args.gemm_tuning {
        let count = save_gemm_tuning(path)?;
        println!("GEMM tuning: {count} algorithm choices written to {}", path.display());
    }
    write_report(&args.out, &summaries)?;
    Ok(summaries)
}

/// `<out>/loss.png` (smoothed curves of every run), `<out>/results.md` and `<out>/summary.json`.
fn write_report(out: &Path, summaries: &[RunSummary]) -> Result<(), LowpError> {
    let longest = summaries.iter().map(|s| s.losses.len()).max().unwrap_or(0);
    let window = (longest / 50).clamp(1, 50);
    let curves: Vec<Curve> = summaries
        .iter()
        .map(|s| Curve {
            label: s.label.clone(),
            points: smooth(
                &s.losses.iter().enumerate().map(|(i, &l)| (s.first_step + i, l)).collect::<Vec<_>>(),
                window,
            ),
        })
        .collect();
    let chart = out.join("loss.png");
    loss_curves(&chart, &format!("MoE LM training loss (moving average of {window} steps)"), &curves)?;
    let table = results_table(summaries);
    let path = out.join("results.md");
    std::fs::write(&path, &table).map_err(|e| LowpError::file(&path, e))?;
    let path = out.join("summary.json");
    let json = serde_json::to_string_pretty(summaries).expect("summaries serialize");
    std::fs::write(&path, json).map_err(|e| LowpError::file(&path, e))?;
    println!("\n{table}\nchart: {}", chart.display());
    Ok(())
}
