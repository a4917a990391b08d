//! The router's top-k choice: one unit per token; round j picks the largest score not yet
//! picked, ties to the lower expert (as k rounds of argmax with the picked ones masked out).

use cubecl::prelude::*;
use cubecl::server::Handle;

use crate::routing::{too_large, ROUTE_UNITS};
use crate::util::buffers::arg;
use crate::util::error::KernelError;
use crate::util::grid::linear_cubes;

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
        for j in 0..k {
            let mut best = 0usize;
            let mut best_value = 0.0f32;
            let mut found = false;
            for e in 0..experts {
                let mut taken = false;
                for i in 0..j {
                    if usize::cast_from(index[t * k + i]) == e {
                        taken = true;
                    }
                }
                let v = scores[base + e];
                if !taken && (!found || v > best_value) {
                    best = e;
                    best_value = v;
                    found = true;
                }
            }
            index[t * k + j] = i32::cast_from(best);
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
                linear_cubes(client, tokens.div_ceil(ROUTE_UNITS)),
                CubeDim::new_1d(ROUTE_UNITS as u32),
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
