//! One AdamW step of a parameter in one kernel: optional clipping of the gradient by its L2 norm,
//! the two moment updates, bias correction, decoupled weight decay and the update, where Burn's
//! `AdamW` with `GradientClipping::Norm` launches about 22 kernels per parameter (every one a
//! host-side launch; a 60-parameter model pays ~1300 of them per optimizer step).
//!
//! The arithmetic is Burn's, operation for operation, in f32 (`burn_lowp::optim` holds the
//! Burn-op twin it is tested against):
//! `coef = min(threshold · 1/(sqrt(Σg²) + min_positive), 1)`, `g ← g · coef`,
//! `m ← m·β1 + g·(1-β1)` (first step `g·(1-β1)`), `v ← v·β2 + g²·(1-β2)` (first step
//! `g²·(1-β2)`), `Δ = (m / c1) / (sqrt(v / c2) + ε)`, `w ← w·decay - Δ·lr`.
//! The moments are f32 whatever the parameter's dtype; the parameter is read and rounded once
//! (nearest even) in its own dtype. Each unit updates one element pair (one 32-bit word of a
//! 16-bit parameter), so callers pass an even element count. The new moments go to one buffer,
//! `v` at a 256-byte-aligned offset after `m` (`moments_views`): eight arrays would exceed
//! wgpu's limit of eight storage buffers per shader (the kernel's metadata takes one).

use cubecl::prelude::*;
use cubecl::server::Handle;

use crate::util::elements::ElemKind;
use crate::util::grid::stride_cubes;
use crate::util::pairs::{load_pair, store_pair};

const UNITS: usize = 256;

/// The step's scalars, computed on the host as Burn computes them.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdamWScalars {
    pub lr: f32,
    pub beta_1: f32,
    pub beta_2: f32,
    pub epsilon: f32,
    /// `1 - lr · weight_decay`.
    pub decay: f32,
    /// `1 - β1^t`, `1 - β2^t`.
    pub correction_1: f32,
    pub correction_2: f32,
    /// Gradient-norm clipping: the threshold and the gradient dtype's smallest positive normal.
    pub clip_threshold: f32,
    pub min_positive: f32,
}

#[cube]
#[allow(clippy::too_many_arguments)]
fn adamw_element(
    w: f32,
    g: f32,
    m: f32,
    v: f32,
    lr: f32,
    beta_1: f32,
    beta_2: f32,
    epsilon: f32,
    decay: f32,
    correction_1: f32,
    correction_2: f32,
    #[comptime] first: bool,
) -> (f32, f32, f32) {
    let mut m_new = g * (1.0f32 - beta_1);
    let mut v_new = (g * g) * (1.0f32 - beta_2);
    if comptime![!first] {
        m_new = m * beta_1 + m_new;
        v_new = v * beta_2 + v_new;
    }
    let m_hat = m_new / correction_1;
    let v_hat = v_new / correction_2;
    let delta = m_hat / (f32::sqrt(v_hat) + epsilon);
    (w * decay - delta * lr, m_new, v_new)
}

#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
pub fn adamw_kernel(
    param: &Array<u32>,
    grad: &Array<u32>,
    m: &Array<f32>,
    v: &Array<f32>,
    sum_squares: &Array<f32>,
    param_out: &mut Array<u32>,
    moments_out: &mut Array<f32>,
    pairs: usize,
    v_offset: usize,
    lr: f32,
    beta_1: f32,
    beta_2: f32,
    epsilon: f32,
    decay: f32,
    correction_1: f32,
    correction_2: f32,
    clip_threshold: f32,
    min_positive: f32,
    #[comptime] param_kind: ElemKind,
    #[comptime] grad_kind: ElemKind,
    #[comptime] clip: bool,
    #[comptime] first: bool,
) {
    let stride = CUBE_COUNT * comptime![UNITS];
    for p in range_stepped(ABSOLUTE_POS, pairs, stride) {
        let i = 2 * p;
        let (ga, gb) = load_pair(grad, i, grad_kind);
        let mut coef = 1.0f32;
        if comptime![clip] {
            coef = f32::min(
                (1.0f32 / (f32::sqrt(sum_squares[0]) + min_positive)) * clip_threshold,
                1.0f32,
            );
        }
        let g0 = ga * coef;
        let g1 = gb * coef;
        let (w0, w1) = load_pair(param, i, param_kind);
        let mut m0 = 0.0f32;
        let mut m1 = 0.0f32;
        let mut v0 = 0.0f32;
        let mut v1 = 0.0f32;
        if comptime![!first] {
            m0 = m[i];
            m1 = m[i + 1];
            v0 = v[i];
            v1 = v[i + 1];
        }
        let (a0, b0, c0) = adamw_element(
            w0, g0, m0, v0, lr, beta_1, beta_2, epsilon, decay, correction_1, correction_2, first,
        );
        let (a1, b1, c1) = adamw_element(
            w1, g1, m1, v1, lr, beta_1, beta_2, epsilon, decay, correction_1, correction_2, first,
        );
        store_pair(param_out, i, a0, a1, param_kind);
        moments_out[i] = b0;
        moments_out[i + 1] = b1;
        moments_out[v_offset + i] = c0;
        moments_out[v_offset + i + 1] = c1;
    }
}

/// What one step writes: the parameter in its dtype, the f32 moments in one buffer.
pub struct AdamWOutput {
    pub param: Handle,
    pub moments: Handle,
}

/// Where `v` starts in the moments buffer, in elements: after `m`, rounded up to 256 bytes (the
/// storage-buffer offset alignment wgpu requires of a view).
pub fn v_offset(n: usize) -> usize {
    n.div_ceil(64) * 64
}

impl AdamWOutput {
    /// `m` and `v` as handles of their own (views of the one buffer).
    pub fn moments_views(&self, n: usize) -> (Handle, Handle) {
        let (v_start, bytes) = (4 * v_offset(n) as u64, 4 * n as u64);
        // The buffer holds 2 · v_offset(n) floats: m is [0, n), v is [v_offset, v_offset + n).
        let m = self.moments.clone().offset_end(2 * v_start - bytes);
        let v = self.moments.clone().offset_start(v_start).offset_end(v_start - bytes);
        (m, v)
    }
}

/// One AdamW step over `n` elements (`n` even). `moments` are the f32 `(m, v)` of the previous
/// step (`None` on the first); `sum_squares` the f32 `Σ g²` when clipping.
#[allow(clippy::too_many_arguments)]
pub fn adamw_step<R: Runtime>(
    client: &ComputeClient<R>,
    param: &Handle,
    param_kind: ElemKind,
    grad: &Handle,
    grad_kind: ElemKind,
    moments: Option<(&Handle, &Handle)>,
    sum_squares: Option<&Handle>,
    n: usize,
    s: AdamWScalars,
) -> AdamWOutput {
    assert!(n % 2 == 0, "the optimizer passes even element counts");
    let out = AdamWOutput {
        param: client.empty((n * param_kind.bytes()).max(4)),
        moments: client.empty(4 * (2 * v_offset(n)).max(1)),
    };
    let pairs = n / 2;
    if pairs == 0 {
        return out;
    }
    let words = |kind: ElemKind| (n * kind.bytes()).div_ceil(4);
    let arg = |h: &Handle, len: usize| unsafe { ArrayArg::from_raw_parts(h.clone(), len.max(1)) };
    let (m, v) = moments.unwrap_or((grad, grad));
    let cubes = stride_cubes(client, pairs, UNITS);
    unsafe {
        adamw_kernel::launch_unchecked::<R>(
            client,
            CubeCount::new_1d(cubes),
            CubeDim::new_1d(UNITS as u32),
            arg(param, words(param_kind)),
            arg(grad, words(grad_kind)),
            arg(m, if moments.is_some() { n } else { 1 }),
            arg(v, if moments.is_some() { n } else { 1 }),
            arg(sum_squares.unwrap_or(grad), 1),
            arg(&out.param, words(param_kind)),
            arg(&out.moments, 2 * v_offset(n)),
            pairs,
            v_offset(n),
            s.lr,
            s.beta_1,
            s.beta_2,
            s.epsilon,
            s.decay,
            s.correction_1,
            s.correction_2,
            s.clip_threshold,
            s.min_positive,
            param_kind,
            grad_kind,
            sum_squares.is_some(),
            moments.is_none(),
        )
    };
    out
}
