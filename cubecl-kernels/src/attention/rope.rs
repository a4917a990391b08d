//! Rotary position embedding (RoPE) as Burn's `RotaryEncoding` applies it, in one pass instead of
//! Burn's four kernels and a matmul. `x` is `[rows, head]` with row r at position
//! `r % seq + start` (a `[batch, heads, seq, head]` tensor, contiguous); the frequencies are
//! Burn's `freq_complex [max_seq, head, 2]` (f32): entry `[s, j]` holds `(cos, sin)` of the angle
//! of element j's pair. One unit rotates one pair `(a, b) = x[2i], x[2i + 1]`:
//!
//! * forward: `(a·cos₀ - b·sin₀, b·cos₁ + a·sin₁)` (Burn's formula: the pair times the signs
//!   `[[1, 0, 0, 1], [0, -1, 1, 0]]`, times the frequencies, summed);
//! * `inverse` (its gradient): `(a·cos₀ + b·sin₁, b·cos₁ - a·sin₀)`,
//!
//! where index 0 is the pair's first element's frequency entry and 1 its second's (Burn stores
//! the same angle twice). The arithmetic is f32; the result is rounded to x's type once.

use crate::util::elements::ElemKind;
use crate::util::error::KernelError;
use crate::util::matrix::WordMatrix;
use crate::util::pairs::{load_pair, store_pair};

use cubecl::prelude::*;
use cubecl::server::Handle;

/// Units per cube.
pub const ROPE_UNITS: usize = 256;

#[cube(launch_unchecked)]
pub fn rope_kernel(
    x: &Array<u32>,
    freq: &Array<f32>,
    out: &mut Array<u32>,
    pairs: usize,
    head: usize,
    seq: usize,
    start: usize,
    #[comptime] kind: ElemKind,
    #[comptime] inverse: bool,
) {
    let pair = CUBE_POS as usize * ROPE_UNITS + UNIT_POS as usize;
    if pair < pairs {
        let index = 2 * pair;
        let row = index / head;
        let col = index % head;
        let f = ((row % seq + start) * head + col) * 2;
        let (a, b) = load_pair(x, index, kind);
        let (ya, yb) = rotate_pair(a, b, freq, f, inverse);
        store_pair(out, index, ya, yb, kind);
    }
}

/// The pair `(a, b)` rotated with the frequencies at `freq[f..f + 4]` (the pair's two entries),
/// forward or `inverse` (the formulas above). Shared by every kernel that applies RoPE, so that
/// they round alike.
#[cube]
pub fn rotate_pair(a: f32, b: f32, freq: &Array<f32>, f: usize, #[comptime] inverse: bool) -> (f32, f32) {
    let (cos0, sin0, cos1, sin1) = (freq[f], freq[f + 1], freq[f + 2], freq[f + 3]);
    let mut ya = a * cos0 - b * sin0;
    let mut yb = b * cos1 + a * sin1;
    if comptime![inverse] {
        ya = a * cos0 + b * sin1;
        yb = b * cos1 - a * sin0;
    }
    (ya, yb)
}

/// RoPE (or, with `inverse`, its gradient) of `x [rows, head]` (rows at positions
/// `row % seq + start`) with the f32 frequencies `freq [max_seq, head, 2]`: a new tensor in x's
/// type.
pub fn rope<R: Runtime>(
    client: &ComputeClient<R>,
    x: WordMatrix,
    freq: &Handle,
    max_seq: usize,
    seq: usize,
    start: usize,
    inverse: bool,
) -> Result<Handle, KernelError> {
    let head = x.cols;
    if head == 0 || head % 2 != 0 || seq == 0 || x.rows % seq != 0 || start + seq > max_seq {
        return Err(KernelError {
            value: format!(
                "x [{}, {head}] of sequence length {seq} from position {start}, frequencies for {max_seq} positions",
                x.rows
            ),
            rule: "RoPE needs an even head size, rows that are whole sequences and positions within the frequency table".into(),
        });
    }
    let pairs = x.rows * head / 2;
    let out = client.empty(x.bytes());
    let cubes = pairs.div_ceil(ROPE_UNITS) as u32;
    unsafe {
        rope_kernel::launch_unchecked::<R>(
            client,
            cubecl::server::CubeCountSelection::new(client, cubes.max(1)).cube_count(),
            CubeDim::new_1d(ROPE_UNITS as u32),
            x.arg(),
            ArrayArg::from_raw_parts(freq.clone(), max_seq * head * 2),
            ArrayArg::from_raw_parts(out.clone(), x.words()),
            pairs,
            head,
            seq,
            start,
            x.kind,
            inverse,
        )
    };
    Ok(out)
}
