//! Attention's causal softmax in one pass each way, instead of Burn's decomposed attention (a
//! scale, the causal mask built from two aranges and filled in, max, subtract, exp, sum and
//! divide forward, each a launch, and their gradients backward). The scores are
//! `x [rows, seq]`: whole `[seq, seq]` blocks of query rows (a `[batch, heads, seq, seq]`
//! tensor, contiguous); row r is query position `q = r % seq` and sees keys `0..=q`.
//!
//! * forward: `p[c] = exp(s[c] - m) / Σ exp(s - m)` with `s = scale · x` over the visible keys,
//!   `m` their max, 0 for the masked keys;
//! * backward (the gradient with respect to `x`): `dx[c] = scale · p[c] · (dp[c] - Σ p · dp)`.
//!
//! One cube of 32 units per row; unit u takes the pairs u, u + 32, ... of the row in order, and
//! the units' partial maxima and sums meet in `cube_max_f32` / `cube_sum`'s fixed tree. The
//! arithmetic is f32 and the result is rounded to x's type once (Burn's decomposed version
//! rounds after every op in x's type).

use crate::util::buffers::arg;
use crate::util::elements::ElemKind;
use crate::util::error::KernelError;
use crate::util::matrix::WordMatrix;
use crate::util::pairs::{load_pair, store_pair};
use crate::util::reduce::{cube_max_f32, cube_sum};

use cubecl::prelude::*;
use cubecl::server::Handle;

/// Units per cube (one cube per row).
pub const SOFTMAX_UNITS: usize = 32;

/// The keys row `CUBE_POS` of `rows` sees: `0..row % seq + 1`; none for the extra cubes of a
/// launch (which still join the cube's reductions).
#[cube]
fn visible_keys(rows: usize, seq: usize) -> usize {
    let row = CUBE_POS as usize;
    let mut visible = 0usize;
    if row < rows {
        visible = row % seq + 1;
    }
    visible
}

/// Forward: `out` = the causal softmax of `scale · x` per row.
#[cube(launch_unchecked)]
pub fn causal_softmax_kernel(
    x: &Array<u32>,
    out: &mut Array<u32>,
    rows: usize,
    seq: usize,
    scale: f32,
    infinity: f32,
    #[comptime] kind: ElemKind,
) {
    let mut scratch = SharedMemory::<f32>::new(SOFTMAX_UNITS);
    let row = CUBE_POS as usize;
    let visible = visible_keys(rows, seq);
    let base = row * seq;
    let mut local_max = -infinity;
    for c in range_stepped(2 * UNIT_POS as usize, visible, 2 * SOFTMAX_UNITS) {
        let (a, b) = load_pair(x, base + c, kind);
        local_max = f32::max(local_max, a * scale);
        if c + 1 < visible {
            local_max = f32::max(local_max, b * scale);
        }
    }
    let m = cube_max_f32(local_max, &mut scratch, SOFTMAX_UNITS);
    let mut local_sum = 0.0f32;
    for c in range_stepped(2 * UNIT_POS as usize, visible, 2 * SOFTMAX_UNITS) {
        let (a, b) = load_pair(x, base + c, kind);
        local_sum += f32::exp(a * scale - m);
        if c + 1 < visible {
            local_sum += f32::exp(b * scale - m);
        }
    }
    let sum = cube_sum(local_sum, &mut scratch, SOFTMAX_UNITS);
    if row < rows {
        for c in range_stepped(2 * UNIT_POS as usize, seq, 2 * SOFTMAX_UNITS) {
            let (a, b) = load_pair(x, base + c, kind);
            let mut pa = 0.0f32;
            let mut pb = 0.0f32;
            if c < visible {
                pa = f32::exp(a * scale - m) / sum;
            }
            if c + 1 < visible {
                pb = f32::exp(b * scale - m) / sum;
            }
            store_pair(out, base + c, pa, pb, kind);
        }
    }
}

fn check(x: &WordMatrix) -> Result<(), KernelError> {
    let (rows, seq) = (x.rows, x.cols);
    if rows == 0 || seq == 0 || seq % 2 != 0 || rows % seq != 0 || rows * seq >= u32::MAX as usize {
        return Err(KernelError {
            value: format!("scores [{rows}, {seq}]"),
            rule: "causal softmax takes whole [seq, seq] blocks of query rows, seq even, fewer \
                   than 2^32 elements"
                .into(),
        });
    }
    Ok(())
}

/// The causal softmax of `scale · x` for scores `x [rows, seq]` (whole `[seq, seq]` blocks, seq
/// even): a new tensor in x's type.
pub fn causal_softmax<R: Runtime>(
    client: &ComputeClient<R>,
    x: WordMatrix,
    scale: f32,
) -> Result<Handle, KernelError> {
    check(&x)?;
    let out = client.empty(x.bytes());
    unsafe {
        causal_softmax_kernel::launch_unchecked::<R>(
            client,
            cubecl::server::CubeCountSelection::new(client, x.rows as u32).cube_count(),
            CubeDim::new_1d(SOFTMAX_UNITS as u32),
            x.arg(),
            ArrayArg::from_raw_parts(out.clone(), x.words()),
            x.rows,
            x.cols,
            scale,
            f32::INFINITY,
            x.kind,
        )
    };
    Ok(out)
}

/// Backward: `out` = `scale · p · (dp - Σ p · dp)` per row (masked keys have p = 0 and get 0).
#[cube(launch_unchecked)]
pub fn causal_softmax_backward_kernel(
    p: &Array<u32>,
    dp: &Array<u32>,
    out: &mut Array<u32>,
    rows: usize,
    seq: usize,
    scale: f32,
    #[comptime] kind: ElemKind,
) {
    let mut scratch = SharedMemory::<f32>::new(SOFTMAX_UNITS);
    let row = CUBE_POS as usize;
    let visible = visible_keys(rows, seq);
    let base = row * seq;
    let mut local_dot = 0.0f32;
    for c in range_stepped(2 * UNIT_POS as usize, visible, 2 * SOFTMAX_UNITS) {
        let (pa, pb) = load_pair(p, base + c, kind);
        let (ga, gb) = load_pair(dp, base + c, kind);
        local_dot += pa * ga;
        if c + 1 < visible {
            local_dot += pb * gb;
        }
    }
    let dot = cube_sum(local_dot, &mut scratch, SOFTMAX_UNITS);
    if row < rows {
        for c in range_stepped(2 * UNIT_POS as usize, seq, 2 * SOFTMAX_UNITS) {
            let (pa, pb) = load_pair(p, base + c, kind);
            let (ga, gb) = load_pair(dp, base + c, kind);
            let mut da = 0.0f32;
            let mut db = 0.0f32;
            if c < visible {
                da = scale * (pa * (ga - dot));
            }
            if c + 1 < visible {
                db = scale * (pb * (gb - dot));
            }
            store_pair(out, base + c, da, db, kind);
        }
    }
}

/// The gradient of `causal_softmax` with respect to its scores, from its output `p` and the
/// output's gradient `dp` (same shape and type): a new tensor in that type.
pub fn causal_softmax_backward<R: Runtime>(
    client: &ComputeClient<R>,
    p: WordMatrix,
    dp: &Handle,
    scale: f32,
) -> Result<Handle, KernelError> {
    check(&p)?;
    let out = client.empty(p.bytes());
    unsafe {
        causal_softmax_backward_kernel::launch_unchecked::<R>(
            client,
            cubecl::server::CubeCountSelection::new(client, p.rows as u32).cube_count(),
            CubeDim::new_1d(SOFTMAX_UNITS as u32),
            p.arg(),
            arg(dp, p.words()),
            ArrayArg::from_raw_parts(out.clone(), p.words()),
            p.rows,
            p.cols,
            scale,
            p.kind,
        )
    };
    Ok(out)
}
