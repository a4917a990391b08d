//! The `moe_train` command line: what to train (a recipe, or `--compare` several), on what
//! (run config, data), where the results go, and the diagnostics (debug config, host profile,
//! per-step sync, GEMM tuning).

use std::path::PathBuf;

use clap::Parser;

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
    /// Stop after this many steps (of the config's `train.steps`, whose learning-rate schedule
    /// still applies) and write the checkpoint there: the first part of a run that `--resume`
    /// continues.
    #[arg(long)]
    pub stop_after: Option<usize>,
    /// Overrides train.expert_parallel_size of the config (ranks per expert-parallel group).
    #[arg(long)]
    pub expert_parallel_size: Option<usize>,
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
    /// Start this many ranks on this host, one GPU each (`LOCAL_RANK` is the CUDA device),
    /// training data parallel: each rank takes its shard of every batch and the gradients are
    /// averaged over the ranks (needs `--features nccl`; docs/multi-gpu.md). Taken off the
    /// command line before it is parsed: the ranks run the other arguments.
    #[arg(long)]
    pub nproc_per_node: Option<usize>,
}
