//! The signature types of the norm ops (`NormOps`): how to normalize (`NormSpec`) and what the
//! forward and backward passes return.

/// How to normalize: LayerNorm or RMSNorm, ε, and whether γ is stored as γ - 1.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct NormSpec {
    pub rms: bool,
    pub eps: f64,
    pub zero_centered_gamma: bool,
}

/// The norm forward's results: `y` in x's dtype, per-row f32 `mean` (0 for RMSNorm) and `rstd`,
/// and the amax of `y` (f32 bits on the device) when asked for and the backend fuses it.
pub struct NormForward<T, A> {
    pub y: T,
    pub mean: T,
    pub rstd: T,
    pub amax: Option<A>,
}

/// The norm backward's results: dx in dy's dtype, f32 dγ and dβ (`[cols]`).
pub struct NormBackward<T> {
    pub dx: T,
    pub dgamma: T,
    pub dbeta: Option<T>,
}
