//! `lowp`: quantize and inspect safetensors checkpoints with burn-lowp's reference quantizers
//! (`lowp quantize`, `lowp inspect`), and summarise a run's debug logs (`lowp debug-summary`).

mod args;
mod inspect;
mod quantize;

use std::process::ExitCode;

use burn_lowp::debug::summary::DebugSummary;
use burn_lowp::error::Result;
use clap::Parser;

use args::{Cli, Command};

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) if !e.use_stderr() => {
            // --help and --version.
            print!("{e}");
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            // clap's usage errors span several lines; keep the promise of one line per error.
            let rendered = e.render().to_string();
            let parts: Vec<&str> = rendered
                .lines()
                .map(str::trim)
                .filter(|l| !l.is_empty() && !l.starts_with("For more information"))
                .collect();
            eprintln!("{} (see lowp --help)", parts.join("; "));
            return ExitCode::from(2);
        }
    };
    match run(&cli) {
        Ok(output) => {
            print!("{output}");
            if !output.ends_with('\n') {
                println!();
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Runs a parsed command line; `main` prints the result or the error.
fn run(cli: &Cli) -> Result<String> {
    match &cli.command {
        Command::Quantize(args) => quantize::run_quantize(args),
        Command::Inspect(args) => inspect::run_inspect(args),
        Command::DebugSummary(args) => Ok(DebugSummary::read(&args.dir)?.to_markdown()),
    }
}
