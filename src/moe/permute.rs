//! Token permutation for the experts, on the device, without a host read: the router's `T·k`
//! assignments (token t's j-th choice is assignment `a = t·k + j`) sorted by expert, stably (in
//! token order within an expert), as the packed batch `GroupedLinear` takes, with `m_splits`.
//!
//! Counting sort in tensor ops: one-hot rows of the assignments' experts, their running sum down
//! the assignments gives each assignment's rank within its expert, the exclusive running sum of
//! the loads gives each expert's first position; `position = first[e] + rank`. A scatter writes
//! each assignment at its position. Gathers move the rows (`permute`), and `unpermute` mixes each
//! token's k expert outputs with the router weights in f32 (a scatter-add, whose gradient is a
//! gather). `GroupedLinear` then moves the packed rows to its 128-row-aligned layout.

use burn::tensor::backend::Backend;
use burn::tensor::{FloatDType, IndexingUpdateOp, Int, Tensor, TensorCreationOptions};

use super::router::one_hot;

/// Where every assignment goes, for a batch of `tokens` tokens with `k` choices each.
#[derive(Debug, Clone)]
pub struct TokenPermutation<B: Backend> {
    pub tokens: usize,
    pub top_k: usize,
    /// Assignments per expert `[E]`.
    pub m_splits: Tensor<B, 1, Int>,
    /// The assignment at each packed position `[T·k]`.
    pub assignment: Tensor<B, 1, Int>,
    /// The token each packed position reads, `assignment / k`, `[T·k]`.
    pub source_token: Tensor<B, 1, Int>,
}

/// Sorts the assignments of `expert_index [T, k]` by expert (stable).
pub fn permutation<B: Backend>(
    expert_index: Tensor<B, 2, Int>,
    experts: usize,
) -> TokenPermutation<B> {
    let [tokens, top_k] = expert_index.dims();
    let n = tokens * top_k;
    let device = expert_index.device();
    let expert = expert_index.reshape([n]);
    let hot = one_hot(expert.clone(), experts); // [n, E]
    let m_splits = hot.clone().sum_dim(0).reshape([experts]);
    // Rank within the expert: how many earlier assignments chose the same expert.
    let rank = (hot.clone().cumsum(0) - hot)
        .gather(1, expert.clone().reshape([n, 1]))
        .reshape([n]);
    let first = m_splits.clone().cumsum(0) - m_splits.clone();
    let position = first.select(0, expert) + rank;
    let ids = Tensor::<B, 1, Int>::arange(0..n as i64, &device);
    let assignment = Tensor::<B, 1, Int>::zeros([n], &device).scatter(
        0,
        position,
        ids,
        IndexingUpdateOp::Add,
    );
    let source_token = assignment.clone().div_scalar(top_k as i64);
    TokenPermutation {
        tokens,
        top_k,
        m_splits,
        assignment,
        source_token,
    }
}

/// `x [T, H]` -> the packed expert batch `[T·k, H]` (each token once per choice).
pub fn permute<B: Backend>(x: Tensor<B, 2>, p: &TokenPermutation<B>) -> Tensor<B, 2> {
    x.select(0, p.source_token.clone())
}

/// The packed expert outputs `y [T·k, H]` -> `[T, H]`: each token's k outputs weighted by the
/// router's `weights [T, k]` and summed, in f32, then cast to `y`'s dtype.
pub fn unpermute<B: Backend>(
    y: Tensor<B, 2>,
    p: &TokenPermutation<B>,
    weights: Tensor<B, 2>,
) -> Tensor<B, 2> {
    let [n, hidden] = y.dims();
    let dtype = y.dtype();
    let w = weights
        .cast(FloatDType::F32)
        .reshape([n])
        .select(0, p.assignment.clone())
        .reshape([n, 1]);
    let weighted = y.cast(FloatDType::F32) * w;
    let out = Tensor::<B, 2>::zeros(
        [p.tokens, hidden],
        TensorCreationOptions::new(weighted.device()).with_dtype(FloatDType::F32.into()),
    )
    .select_assign(0, p.source_token.clone(), weighted, IndexingUpdateOp::Add);
    out.cast(dtype)
}
