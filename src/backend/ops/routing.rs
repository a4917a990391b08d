//! `RoutingOps`: an MoE layer's token routing on the backend: the router's top-k choice, the
//! stable sort of the `T·k` assignments by expert, their rows in the experts' aligned batch
//! (`TokenRoutes`), and the weighted combine of the experts' rows back into tokens with its two
//! gradients. Below the trait, each default's reference in Burn tensor ops (some forty launches
//! per layer on a GPU, where the CubeCL kernels take one or a few per step); the differentiable
//! dispatch and combine that use them are `ops::token_routing`.

use burn::tensor::ops::{FloatTensor, IntTensor};
use burn::tensor::{Bool, FloatDType, IndexingUpdateOp, Int, Tensor, TensorMetadata, TensorPrimitive};

use super::grouped::select_rows_or_zero;
use crate::backend::{GroupLayout, LowpBackend, TokenRoutes};
use crate::error::{LowpError, Result};

pub trait RoutingOps<B: LowpBackend> {
    /// The experts of each token, `[T, k]` i32-or-wider Int, best first (ties to the lower
    /// expert), from scores `[T, E]`. The default runs k rounds of argmax (`top_k_reference`);
    /// CubeBackend one kernel.
    fn route_top_k(scores: FloatTensor<B>, k: usize) -> Result<IntTensor<B>> {
        top_k_reference::<B>(scores, k)
    }

    /// The stable sort of `n` assignments by expert (`expert [n]`): the experts' counts `[E]`
    /// and each assignment's packed position `[n]`. The default is a counting sort in tensor ops
    /// (`expert_positions_reference`); CubeBackend three kernels.
    fn route_expert_positions(
        expert: IntTensor<B>,
        experts: usize,
    ) -> Result<(IntTensor<B>, IntTensor<B>)> {
        expert_positions_reference::<B>(expert, experts)
    }

    /// The rows of the assignments at `position [T·k]` in `layout`, and the inverse maps.
    fn route_rows(position: IntTensor<B>, layout: &GroupLayout<B>, k: usize) -> Result<TokenRoutes<B>> {
        route_rows_reference::<B>(position, layout, k)
    }

    /// Each token's k rows of the aligned `y [rows, cols]`, weighted by f32 `weights [T, k]`
    /// (summed when `None`) in f32: `[T, cols]` in y's dtype.
    fn route_combine_rows(
        y: FloatTensor<B>,
        weights: Option<FloatTensor<B>>,
        routes: &TokenRoutes<B>,
    ) -> Result<FloatTensor<B>> {
        combine_rows_reference::<B>(y, weights, routes)
    }

    /// The gradient of `route_combine_rows` with respect to y: `[rows, cols]` in dout's dtype.
    fn route_combine_rows_backward(
        dout: FloatTensor<B>,
        weights: Option<FloatTensor<B>>,
        routes: &TokenRoutes<B>,
    ) -> Result<FloatTensor<B>> {
        combine_rows_backward_reference::<B>(dout, weights, routes)
    }

    /// The gradient of `route_combine_rows` with respect to its weights: f32 `[T, k]`.
    fn route_combine_weights_grad(
        dout: FloatTensor<B>,
        y: FloatTensor<B>,
        routes: &TokenRoutes<B>,
    ) -> Result<FloatTensor<B>> {
        combine_weights_grad_reference::<B>(dout, y, routes)
    }
}

fn float<B: burn::tensor::backend::Backend, const D: usize>(t: FloatTensor<B>) -> Tensor<B, D> {
    Tensor::from_primitive(TensorPrimitive::Float(t))
}

fn int<B: burn::tensor::backend::Backend, const D: usize>(t: IntTensor<B>) -> Tensor<B, D, Int> {
    Tensor::from_primitive(t)
}

/// Checks `scores [T, E]` for a top-k choice; `(T, E)`.
pub(crate) fn check_top_k<B: LowpBackend>(scores: &FloatTensor<B>, k: usize) -> Result<(usize, usize)> {
    let dims = scores.shape().as_slice().to_vec();
    match dims.as_slice() {
        [tokens, experts] if *tokens >= 1 && k >= 1 && k <= *experts => Ok((*tokens, *experts)),
        _ => Err(LowpError::shape(
            "router scores",
            format!("{dims:?} for top {k}"),
            "top-k takes [tokens, experts] scores of at least one token and k between 1 and the number of experts",
        )),
    }
}

/// `RoutingOps::route_top_k` in Burn ops: k rounds of argmax, each masking out its choice.
pub fn top_k_reference<B: LowpBackend>(scores: FloatTensor<B>, k: usize) -> Result<IntTensor<B>> {
    let (tokens, experts) = check_top_k::<B>(&scores, k)?;
    let scores = float::<B, 2>(scores).cast(FloatDType::F32);
    let columns =
        Tensor::<B, 1, Int>::arange(0..experts as i64, &scores.device()).reshape([1, experts]);
    let mut remaining = scores;
    let mut chosen = Vec::with_capacity(k);
    for _ in 0..k {
        let index = remaining.clone().argmax(1); // [T, 1]
        let taken: Tensor<B, 2, Bool> = index
            .clone()
            .expand([tokens, experts])
            .equal(columns.clone().expand([tokens, experts]));
        remaining = remaining.mask_fill(taken, f32::NEG_INFINITY);
        chosen.push(index);
    }
    Ok(Tensor::cat(chosen, 1).into_primitive())
}

/// `[n]` indices -> `[n, classes]` 0/1 Int rows.
pub(crate) fn one_hot<B: burn::tensor::backend::Backend>(
    index: Tensor<B, 1, Int>,
    classes: usize,
) -> Tensor<B, 2, Int> {
    let [n] = index.dims();
    let columns = Tensor::<B, 1, Int>::arange(0..classes as i64, &index.device())
        .reshape([1, classes])
        .expand([n, classes]);
    index.reshape([n, 1]).expand([n, classes]).equal(columns).int()
}

/// Checks the experts of `n` assignments (`[n]`); `n`.
pub(crate) fn check_assignments<B: LowpBackend>(expert: &IntTensor<B>, experts: usize) -> Result<usize> {
    let dims = expert.shape().as_slice().to_vec();
    match dims.as_slice() {
        [n] if *n >= 1 && experts >= 1 => Ok(*n),
        _ => Err(LowpError::shape(
            "assignments' experts",
            format!("{dims:?} for {experts} experts"),
            "one expert index per assignment ([T·k], at least one) and at least one expert",
        )),
    }
}

/// `RoutingOps::route_expert_positions` in Burn ops, a counting sort: one-hot rows of the
/// assignments' experts, their running sum down the assignments gives each one's rank within
/// its expert, the exclusive running sum of the loads each expert's first position.
pub fn expert_positions_reference<B: LowpBackend>(
    expert: IntTensor<B>,
    experts: usize,
) -> Result<(IntTensor<B>, IntTensor<B>)> {
    let n = check_assignments::<B>(&expert, experts)?;
    let expert = int::<B, 1>(expert);
    let hot = one_hot(expert.clone(), experts); // [n, E]
    let m_splits = hot.clone().sum_dim(0).reshape([experts]);
    let rank = (hot.clone().cumsum(0) - hot).gather(1, expert.clone().reshape([n, 1])).reshape([n]);
    let first = m_splits.clone().cumsum(0) - m_splits.clone();
    let position = first.select(0, expert) + rank;
    Ok((m_splits.into_primitive(), position.into_primitive()))
}

/// `RoutingOps::route_rows` in Burn ops: the aligned row of every packed position, and
/// the inverse of `position` (a scatter) read through the layout's row map.
pub fn route_rows_reference<B: LowpBackend>(
    position: IntTensor<B>,
    layout: &GroupLayout<B>,
    k: usize,
) -> Result<TokenRoutes<B>> {
    let n = check_routes::<B>(&position, layout, k)?;
    let position = int::<B, 1>(position);
    let device = position.device();
    let assignment_row = int::<B, 1>(layout.packed_to_aligned.clone()).select(0, position.clone());
    let ids = Tensor::<B, 1, Int>::arange(0..n as i64, &device);
    let assignment_at = Tensor::<B, 1, Int>::zeros([n], &device).scatter(0, position, ids, IndexingUpdateOp::Add);
    // Rows without a token read "one past the last packed position": n.
    let assignment_at = Tensor::cat(vec![assignment_at, Tensor::full([1], n as i64, &device)], 0);
    let row_assignment = assignment_at.select(0, int::<B, 1>(layout.aligned_to_packed.clone()).clamp_max(n as i64));
    let row_token = row_assignment.clone().div_scalar(k as i64);
    Ok(TokenRoutes {
        tokens: n / k,
        top_k: k,
        rows: layout.rows(),
        assignment_row: assignment_row.into_primitive(),
        row_assignment: row_assignment.into_primitive(),
        row_token: row_token.into_primitive(),
    })
}

/// Checks `position [n]` against the layout (made for n packed tokens) and k; `n`.
pub(crate) fn check_routes<B: LowpBackend>(position: &IntTensor<B>, layout: &GroupLayout<B>, k: usize) -> Result<usize> {
    let dims = position.shape().as_slice().to_vec();
    match dims.as_slice() {
        [n] if k >= 1 && n % k == 0 && *n == layout.tokens => Ok(*n),
        _ => Err(LowpError::shape(
            "assignments' positions",
            format!("{dims:?} with k = {k}, a layout of {} tokens", layout.tokens),
            "one position per assignment of whole tokens, as many as the layout's packed tokens",
        )),
    }
}

/// Checks `y [rows, cols]` and `weights [T, k]` (when given) for a combine; `cols`.
pub(crate) fn check_combine<B: LowpBackend>(
    y: &FloatTensor<B>,
    weights: Option<&FloatTensor<B>>,
    routes: &TokenRoutes<B>,
) -> Result<usize> {
    let dims = y.shape().as_slice().to_vec();
    let cols = match dims.as_slice() {
        [rows, cols] if *rows == routes.rows => *cols,
        _ => {
            return Err(LowpError::shape(
                "expert rows",
                format!("{dims:?}"),
                format!("combine takes the aligned batch [{}, cols]", routes.rows),
            ))
        }
    };
    if let Some(w) = weights {
        let w_dims = w.shape().as_slice().to_vec();
        if w_dims != [routes.tokens, routes.top_k] {
            return Err(LowpError::shape(
                "router weights",
                format!("{w_dims:?}"),
                format!("one weight per assignment, [{}, {}]", routes.tokens, routes.top_k),
            ));
        }
    }
    Ok(cols)
}

/// The rows of `t [rows, cols]` of every assignment, `[T·k, cols]` (zero where none), in f32.
fn assignment_rows_f32<B: LowpBackend>(t: FloatTensor<B>, assignment_row: IntTensor<B>) -> Tensor<B, 2> {
    float::<B, 2>(select_rows_or_zero::<B>(t, assignment_row)).cast(FloatDType::F32)
}

/// `RoutingOps::route_combine_rows` in Burn ops: `[T, cols]`, token t's rows weighted (f32)
/// and summed over its k choices, rounded to y's dtype once.
pub fn combine_rows_reference<B: LowpBackend>(
    y: FloatTensor<B>,
    weights: Option<FloatTensor<B>>,
    routes: &TokenRoutes<B>,
) -> Result<FloatTensor<B>> {
    let cols = check_combine::<B>(&y, weights.as_ref(), routes)?;
    let dtype = y.dtype();
    let (tokens, k) = (routes.tokens, routes.top_k);
    let mut rows = assignment_rows_f32::<B>(y, routes.assignment_row.clone());
    if let Some(w) = weights {
        rows = rows * float::<B, 2>(w).cast(FloatDType::F32).reshape([tokens * k, 1]);
    }
    let out = rows.reshape([tokens, k, cols]).sum_dim(1).reshape([tokens, cols]);
    Ok(out.cast(dtype).into_primitive().tensor())
}

/// `RoutingOps::route_combine_rows_backward` in Burn ops: `[rows, cols]` in dout's dtype, row r
/// holding assignment a of token t gets `w[a] · dout[t]`, rows without one zeros.
pub fn combine_rows_backward_reference<B: LowpBackend>(
    dout: FloatTensor<B>,
    weights: Option<FloatTensor<B>>,
    routes: &TokenRoutes<B>,
) -> Result<FloatTensor<B>> {
    let dtype = dout.dtype();
    let rows = float::<B, 2>(select_rows_or_zero::<B>(dout, routes.row_token.clone()));
    let Some(w) = weights else {
        return Ok(rows.into_primitive().tensor());
    };
    let n = routes.tokens * routes.top_k;
    let w = float::<B, 2>(w).cast(FloatDType::F32).reshape([n, 1]);
    let w_rows = float::<B, 2>(select_rows_or_zero::<B>(w.into_primitive().tensor(), routes.row_assignment.clone()));
    Ok((rows.cast(FloatDType::F32) * w_rows).cast(dtype).into_primitive().tensor())
}

/// `RoutingOps::route_combine_weights_grad` in Burn ops: f32 `[T, k]`, each assignment's row of
/// `y` dotted with its token's row of `dout`.
pub fn combine_weights_grad_reference<B: LowpBackend>(
    dout: FloatTensor<B>,
    y: FloatTensor<B>,
    routes: &TokenRoutes<B>,
) -> Result<FloatTensor<B>> {
    let (tokens, k) = (routes.tokens, routes.top_k);
    let rows = assignment_rows_f32::<B>(y, routes.assignment_row.clone());
    let cols = rows.dims()[1];
    let dout = float::<B, 2>(dout).cast(FloatDType::F32).reshape([tokens, 1, cols]).expand([tokens, k, cols]).reshape([tokens * k, cols]);
    Ok((dout * rows).sum_dim(1).reshape([tokens, k]).into_primitive().tensor())
}
