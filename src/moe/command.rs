//! The `moe_train` command (`examples/moe_train.rs` is its `main`): one recipe, or `--compare`
//! several under the same seed and data, with the loss-curve chart and a results table.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use burn::tensor::backend::AutodiffBackend;
use clap::Parser;

use super::data::Corpus;
use super::plot::{loss_curves, smooth, Curve};
use super::run_config::RunConfig;
use super::train::{train, RunSummary, TrainRun};
use crate::debug::{DebugConfig, DebugSummary};
use crate::error::LowpError;
use crate::backend::{load_gemm_tuning, save_gemm_tuning, LowpBackend};
use crate::ops::LowpLinear;
use crate::recipe::Recipe;

#[derive(Parser, Debug, Clone)]
#[command(
    name = "moe_train",
    about = "Train a mixture-of-experts language model with burn-lowp under a low-precision recipe"
)]
pub struct MoeTrainArgs {
    /// Recipe file (recipes/*.json). Default: bf16.
    #[arg(long)]
    pub recipe: Option<PathBuf>,
    /// Train the same seed and data under each of these recipes and compare them.
    #[arg(long, num_args = 1.., conflicts_with_all = ["recipe", "resume"])]
    pub compare: Vec<PathBuf>,
    /// Run config with "model" and "train" sections (configs/*.json). Default: a tiny model.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// UTF-8 text to train on (byte tokens). Default: a built-in deterministic corpus.
    #[arg(long)]
    pub data: Option<PathBuf>,
    /// Overrides train.steps of the config.
    #[arg(long)]
    pub steps: Option<usize>,
    /// Continue from a checkpoint directory (`<out>/<recipe>/checkpoint`).
    #[arg(long)]
    pub resume: Option<PathBuf>,
    /// Where metrics, checkpoints, the chart and the results go.
    #[arg(long, default_value = "runs/moe_train")]
    pub out: PathBuf,
    /// Backend: cpu, wgpu or cuda (those compiled in); default: cuda, then wgpu, then cpu.
    #[arg(long)]
    pub backend: Option<String>,
    /// No progress bar (logs and CI).
    #[arg(long)]
    pub quiet: bool,
    /// Debug config (JSON; `burn_lowp::debug::config`): tensor statistics and AutoswitchGemm,
    /// logged to `<out>/<recipe>/debug/`, with a switch summary at the end of each run.
    #[arg(long, conflicts_with = "report")]
    pub debug_config: Option<PathBuf>,
    /// Write no checkpoint (benchmark runs: a checkpoint holds the weights and both AdamW
    /// moments in f32, 22 GB for configs/moe-1.9b.json).
    #[arg(long, conflicts_with = "report")]
    pub no_checkpoint: bool,
    /// Diagnostic: wait for the device after every step and record how long the host spent
    /// enqueueing the step and how long it then waited for the GPU (`summary.json`): a wait near
    /// zero means the step is bound by the host, not the GPU. Slows training a little.
    #[arg(long, conflicts_with = "report")]
    pub sync_every_step: bool,
    /// Diagnostic: sample the host's CPU time (every thread) over the steps after the first 5 and
    /// write `flamegraph.svg` and `summary.txt` to `<this dir>/<recipe>/`. Needs a build with
    /// `--features host-profile`.
    #[arg(long, conflicts_with = "report")]
    pub host_profile: Option<PathBuf>,
    /// GEMM algorithm choices (`burn_lowp::backend::gemm_tuning`): loaded before training if the
    /// file exists, written after it (every choice of the process). Runs with the same file on the
    /// same GPU and cuBLASLt version repeat bit for bit; without one, each run times the
    /// candidates again and may keep others. Each run also writes its choices to
    /// `<out>/<recipe>/gemm-tuning.json`, and checkpoints keep them for `--resume`.
    #[arg(long, conflicts_with = "report")]
    pub gemm_tuning: Option<PathBuf>,
    /// Train nothing: draw the chart and write the table from the runs already in --out (each
    /// `<out>/<recipe>/summary.json`), e.g. recipes trained by separate invocations.
    #[arg(long, conflicts_with_all = ["recipe", "compare", "resume", "steps"])]
    pub report: bool,
    /// Train nothing: build the model under each recipe and list the quantizer every slot of
    /// every module gets (one line per distinct assignment), as each run prints at its start.
    #[arg(long, conflicts_with_all = ["report", "resume"])]
    pub explain_recipe: bool,
}

/// Bytes of the built-in corpus.
const BUILT_IN_CORPUS: usize = 4 << 20;

fn label(path: &Path) -> String {
    path.file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| path.display().to_string())
}

/// The results table as Markdown: one row per run; speed-up and loss gap against the first run
/// (or the run labelled `bf16` when there is one).
pub fn results_table(runs: &[RunSummary]) -> String {
    let base = runs.iter().find(|r| r.label == "bf16").or(runs.first());
    let mut out = String::from(
        "| recipe | final loss | vs base | held-out loss | vs base | tokens/s | speed-up | ms/step | split reads/step (blocking) | peak pool memory |\n\
         |---|---|---|---|---|---|---|---|---|---|\n",
    );
    for r in runs {
        let (gap, eval_gap, speed) = match base {
            Some(b) => (
                100.0 * (r.final_loss / b.final_loss - 1.0),
                100.0 * (r.eval_loss / b.eval_loss - 1.0),
                r.tokens_per_s / b.tokens_per_s,
            ),
            None => (0.0, 0.0, 1.0),
        };
        let memory = r
            .peak_memory_bytes
            .map(|b| format!("{:.2} GiB", b as f64 / (1u64 << 30) as f64))
            .unwrap_or_else(|| "-".into());
        let _ = writeln!(
            out,
            "| {} | {:.4} | {:+.2} % | {:.4} | {:+.2} % | {:.0} | {:.2}x | {:.1} | {:.2} ({:.2}) | {} |",
            r.label,
            r.final_loss,
            gap,
            r.eval_loss,
            eval_gap,
            r.tokens_per_s,
            speed,
            r.step_ms,
            r.split_reads_per_step,
            r.blocking_split_reads_per_step,
            memory
        );
    }
    out
}

/// Runs the command on backend `B`; returns every run's summary (also written to
/// `<out>/summary.json`, `<out>/results.md` and drawn in `<out>/loss.png`).
pub fn run<B>(args: &MoeTrainArgs, device: &B::Device, memory_probe: Option<&dyn Fn() -> u64>) -> Result<Vec<RunSummary>, LowpError>
where
    B: AutodiffBackend + LowpLinear,
    B::InnerBackend: LowpLinear + LowpBackend,
{
    if args.report {
        let summaries = read_summaries(&args.out)?;
        write_report(&args.out, &summaries)?;
        return Ok(summaries);
    }
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
    let corpus = match &args.data {
        Some(path) => Corpus::from_file(path)?,
        None => Corpus::built_in(BUILT_IN_CORPUS),
    };
    corpus.check_fits(config.train.seq_len)?;
    // Every recipe file is read and validated before anything trains.
    let recipes: Vec<(String, Recipe)> = match (&args.recipe, args.compare.is_empty()) {
        (_, false) => args
            .compare
            .iter()
            .map(|p| Ok((label(p), Recipe::load(p)?)))
            .collect::<Result<_, LowpError>>()?,
        (Some(path), true) => vec![(label(path), Recipe::load(path)?)],
        (None, true) => vec![("bf16".into(), Recipe::from_json(r#"{"recipe": "bf16"}"#)?)],
    };
    let debug = args.debug_config.as_ref().map(DebugConfig::load).transpose()?;
    if let Some(path) = args.gemm_tuning.as_ref().filter(|p| p.exists()) {
        let count = load_gemm_tuning(path)?;
        println!("GEMM tuning: {count} algorithm choices from {}", path.display());
    }
    if args.explain_recipe {
        for (name, recipe) in &recipes {
            let model: crate::moe::MoeLm<B> = config.model.init(recipe, device)?;
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
    std::fs::create_dir_all(&args.out).map_err(|e| LowpError::file(&args.out, e))?;
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
        let summary = train::<B>(
            &TrainRun {
                config: &config,
                recipe,
                label: name.clone(),
                corpus: &corpus,
                out_dir: args.out.join(name),
                resume: args.resume.clone(),
                stop_after: None,
                checkpoints: !args.no_checkpoint,
                progress: !args.quiet,
                memory_probe,
                debug: debug.as_ref(),
                sync_every_step: args.sync_every_step,
                host_profile: args.host_profile.as_ref().map(|dir| dir.join(name)),
            },
            device,
        )?;
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

    if let Some(path) = &args.gemm_tuning {
        let count = save_gemm_tuning(path)?;
        println!("GEMM tuning: {count} algorithm choices written to {}", path.display());
    }
    write_report(&args.out, &summaries)?;
    Ok(summaries)
}

/// The summaries of the runs under `out` (`<out>/<label>/summary.json`), bf16 first, then by name.
pub fn read_summaries(out: &Path) -> Result<Vec<RunSummary>, LowpError> {
    let entries = std::fs::read_dir(out).map_err(|e| LowpError::file(out, e))?;
    let mut summaries = Vec::new();
    for entry in entries {
        let path = entry.map_err(|e| LowpError::file(out, e))?.path().join("summary.json");
        if !path.is_file() {
            continue;
        }
        let text = std::fs::read_to_string(&path).map_err(|e| LowpError::file(&path, e))?;
        let summary: RunSummary =
            serde_json::from_str(&text).map_err(|e| LowpError::file(&path, format!("not a run summary: {e}")))?;
        summaries.push(summary);
    }
    if summaries.is_empty() {
        return Err(LowpError::file(out, "holds no runs (<out>/<recipe>/summary.json); train some first"));
    }
    summaries.sort_by(|a: &RunSummary, b: &RunSummary| (a.label != "bf16", &a.label).cmp(&(b.label != "bf16", &b.label)));
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
