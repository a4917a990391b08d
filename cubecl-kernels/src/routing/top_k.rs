//! The router's top-k choice: one unit per token; round j picks the largest score not yet
//! picked, ties to the lower expert (as k rounds of argmax with the picked ones masked out).
//!
//! The picks run down one total order (score descending, then expert ascending), so "not yet
//! picked" is "ranked below the previous pick": each round compares against the previous pick
//! alone instead of searching the picks so far (k² · E index reads a token before), and reads the
//! row from cache. Launched in cubes of `TOP_K_UNITS`: 8,192 tokens in 256-unit cubes had filled
//! 32 of an H200's 132 SMs (135 µs a layer, 2026-11-28 trace). Scores with a NaN have no order;
//! their picks are unspecified (as before).

use cubecl::prelude::*;
use cubecl::server::Handle;

use crate::routing::too_large;
use crate::util::buffers::arg;
use crate::util::error::KernelError;
use crate::util::grid::linear_cubes;

/// Units (tokens) per cube.
pub const TOP_K_UNITS: usize = 64;

/// `index [tokens, k]`: the k largest of each row of `scores [tokens, experts]`, largest first.
#[cube(launch_unchecked)]
pub fn top_k_kernel(
    scores: &Array<f32>,
    index: &mut Array<i32>,
    tokens: usize,
    experts: usize,
    k: usize,
) {
    let t = ABSOLUTE_POS;
    if t < tokens {
        let base = t * experts;
        let mut previous = 0usize;
        let mut previous_value = 0.0f32;
        for j in 0..k {
            let mut best = 0usize;
            let mut best_value = 0.0f32;
            let mut found = false;
            for e in 0..experts {
                let v = scores[base + e];
                // Ranked below the previous pick: a smaller score, or an equal one at a higher
                // expert (the previous pick took the lowest of its ties).
                let below = j == 0 || v < previous_value || (v == previous_value && e > previous);
                if below && (!found || v > best_value) {
                    best = e;
                    best_value = v;
                    found = true;
                }
            }
            index[t * k + j] = i32::cast_from(best);
            previous = best;
            previous_value = best_value;
        }
    }
}

/// `[tokens, k]` i32 expert indices: the top k of each row of f32 `scores [tokens, experts]`.
pub fn top_k<R: Runtime>(
    client: &ComputeClient<R>,
    scores: &Handle,
    tokens: usize,
    experts: usize,
    k: usize,
) -> Result<Handle, KernelError> {
    if k == 0 || k > experts || tokens * experts >= u32::MAX as usize {
        return Err(too_large(
            format!("top {k} of scores [{tokens}, {experts}]"),
            "k must be between 1 and the number of experts, scores fewer than 2^32",
        ));
    }
    let out = client.empty((tokens * k).max(1) * 4);
    if tokens > 0 {
        unsafe {
            top_k_kernel::launch_unchecked::<R>(
                client,
                linear_cubes(client, tokens.div_ceil(TOP_K_UNITS)),
                CubeDim::new_1d(TOP_K_UNITS as u32),
                arg(scores, tokens * experts),
                arg(&out, tokens * k),
                tokens,
                experts,
                k,
            )
        };
    }
    Ok(out)
}
