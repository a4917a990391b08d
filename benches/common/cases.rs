//! What the CUDA benchmarks share besides timing: which cases run, and the recipe files.
#![allow(dead_code)] // each bench uses part of it

use burn_lowp::recipe::Recipe;

/// `LOWP_BENCH_FILTER=text` runs only the cases whose name (`gemm bf16 8192x8192x8192`,
/// `linear_step current_scaling`, ...) contains `text` (for profiling one case); `text$` only
/// those whose name ends with `text` (`mlp_step gelu current_scaling$` leaves out
/// `current_scaling_fast_accumulation`).
pub fn selected(name: &str) -> bool {
    std::env::var("LOWP_BENCH_FILTER").map_or(true, |f| match f.strip_suffix('$') {
        Some(end) => name.ends_with(end),
        None => name.contains(&f),
    })
}

/// `LOWP_BENCH_PROFILE_STEPS=n`: run each selected step n times untimed and report nothing, for
/// a profiler or tracer (ncu, `benches/profile/cupti_trace.c`).
pub fn profile_steps() -> Option<usize> {
    std::env::var("LOWP_BENCH_PROFILE_STEPS").ok().and_then(|s| s.parse().ok())
}

/// A recipe file from this repository's `recipes/`, or `./recipes` where the bench runs from a
/// copy of the repository root (bench binaries copied to a GPU machine with `recipes/`).
pub fn recipe(name: &str) -> Recipe {
    let dir = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("recipes");
    let dir = if dir.is_dir() { dir } else { "recipes".into() };
    Recipe::load(dir.join(name)).expect("recipe file")
}

/// `LOWP_BENCH_FP8_ENCODER=integer` makes the FP8 quantize kernels use their integer encoder
/// instead of CUDA's conversion instruction (same codes; for A/B runs). Returns the encoder's name
/// for the JSON lines.
pub fn fp8_encoder_from_env() -> &'static str {
    let integer = std::env::var("LOWP_BENCH_FP8_ENCODER").is_ok_and(|e| e == "integer");
    burn_lowp_kernels::force_integer_fp8_encoder(integer);
    if integer {
        "integer"
    } else {
        "instruction"
    }
}
