//! An MoE layer's token routing: the router's top-k choice, the stable sort of the `T·k`
//! assignments by expert (assignment `a = t·k + j` is token t's j-th choice), their rows in the
//! experts' aligned batch (`backend::grouped::GroupLayout`), and two differentiable moves:
//! `dispatch` (token rows into the aligned batch, one per assignment, zero padding) and
//! `combine` (each token's k expert rows weighted by the router and summed in f32).
//!
//! The CubeCL kernels (`burn_lowp_kernels::token_routing`) do each step in one or a few
//! launches; the `*_reference` functions here are the same steps in Burn tensor ops (some forty
//! launches per layer on a GPU), the `LowpBackend` defaults for the other backends and the
//! references the kernel tests compare against. Nothing reads the device on the host.
//!
//! Gradients: `dispatch`'s is a `combine` without weights (each token sums the rows it was
//! copied to); `combine`'s is, for y, each row's token gradient times its weight, and for the
//! weights, the dot product of each assignment's row with its token's gradient.

use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::Autodiff;
use burn::tensor::ops::{FloatTensor, IntTensor};
use burn::tensor::{
    Bool, FloatDType, IndexingUpdateOp, Int, Tensor, TensorMetadata, TensorPrimitive,
};

use super::grouped_rows::select_rows_or_zero;
use super::LowpLinear;
pub use crate::backend::routing::TokenRoutes;
use crate::backend::{GroupLayout, LowpBackend};
use crate::error::{LowpError, Result};

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

/// `LowpBackend::lowp_top_k` in Burn ops: k rounds of argmax, each masking out its choice.
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

/// `LowpBackend::lowp_expert_positions` in Burn ops, a counting sort: one-hot rows of the
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

/// `LowpBackend::lowp_route_rows` in Burn ops: the aligned row of every packed position, and
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
fn check_combine<B: LowpBackend>(
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

/// `LowpBackend::lowp_combine_rows` in Burn ops: `[T, cols]`, token t's rows weighted (f32)
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

/// `LowpBackend::lowp_combine_rows_backward` in Burn ops: `[rows, cols]` in dout's dtype, row r
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

/// `LowpBackend::lowp_combine_weights_grad` in Burn ops: f32 `[T, k]`, each assignment's row of
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

/// The experts chosen for each token, `[T, k]`, best first (ties to the lower expert), from
/// scores `[T, E]`; no gradient.
pub fn top_k<B: LowpLinear>(scores: Tensor<B, 2>, k: usize) -> Result<Tensor<B, 2, Int>> {
    let index = B::Quant::lowp_top_k(B::to_quant(scores.into_primitive().tensor()), k)?;
    Ok(Tensor::from_primitive(B::int_from_quant(index)))
}

/// The stable sort of the assignments of `expert_index [T, k]` by expert: the experts' token
/// counts `[E]` (the grouped GEMMs' `m_splits`) and each assignment's packed position `[T·k]`.
pub fn expert_positions<B: LowpLinear>(
    expert_index: Tensor<B, 2, Int>,
    experts: usize,
) -> Result<(Tensor<B, 1, Int>, Tensor<B, 1, Int>)> {
    let [tokens, k] = expert_index.dims();
    let expert = B::int_to_quant(expert_index.reshape([tokens * k]).into_primitive());
    let (m_splits, position) = B::Quant::lowp_expert_positions(expert, experts)?;
    Ok((
        Tensor::from_primitive(B::int_from_quant(m_splits)),
        Tensor::from_primitive(B::int_from_quant(position)),
    ))
}

/// The routes of the assignments at `position [T·k]` in `layout` (made from their `m_splits`).
pub fn token_routes<B: LowpLinear>(
    position: Tensor<B, 1, Int>,
    layout: &GroupLayout<B::Quant>,
    k: usize,
) -> Result<TokenRoutes<B::Quant>> {
    B::Quant::lowp_route_rows(B::int_to_quant(position.into_primitive()), layout, k)
}

/// Token rows `x [T, cols]` into the aligned batch `[rows, cols]`: row r is token
/// `row_token[r]`'s row, zero padding.
pub fn dispatch<B: LowpLinear>(x: Tensor<B, 2>, routes: &TokenRoutes<B::Quant>) -> Result<Tensor<B, 2>> {
    let [tokens, _] = x.dims();
    if tokens != routes.tokens {
        return Err(LowpError::shape(
            "tokens to dispatch",
            format!("{:?}", x.dims()),
            format!("the routes were made for {} tokens", routes.tokens),
        ));
    }
    Ok(float(B::lowp_dispatch(x.into_primitive().tensor(), routes)))
}

/// The aligned expert rows `y [rows, cols]` back to tokens: `[T, cols]`, each token's k rows
/// weighted by `weights [T, k]` (f32) and summed in f32, in y's dtype.
pub fn combine<B: LowpLinear>(
    y: Tensor<B, 2>,
    weights: Tensor<B, 2>,
    routes: &TokenRoutes<B::Quant>,
) -> Result<Tensor<B, 2>> {
    Ok(float(B::lowp_combine(
        y.into_primitive().tensor(),
        weights.into_primitive().tensor(),
        routes,
    )?))
}

/// `dispatch` without autodiff.
pub fn dispatch_rows<B: LowpBackend>(x: FloatTensor<B>, routes: &TokenRoutes<B>) -> FloatTensor<B> {
    B::lowp_gather_rows(x, routes.row_token.clone())
}

/// `combine` without autodiff.
pub fn combine_rows<B: LowpBackend>(
    y: FloatTensor<B>,
    weights: FloatTensor<B>,
    routes: &TokenRoutes<B>,
) -> Result<FloatTensor<B>> {
    check_combine::<B>(&y, Some(&weights), routes)?;
    B::lowp_combine_rows(y, Some(weights), routes)
}

#[derive(Debug)]
struct DispatchBackward;

impl<B: LowpBackend> Backward<B, 1> for DispatchBackward {
    type State = TokenRoutes<B>;

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let [node] = ops.parents;
        let routes = ops.state;
        let dy = grads.consume::<B>(&ops.node);
        if let Some(node) = node {
            // Shapes were checked in forward; a failure here is a bug, not user input.
            let dx = B::lowp_combine_rows(dy, None, &routes).expect("dispatch backward");
            grads.register::<B>(node.id, dx);
        }
    }
}

/// `dispatch_rows` on `Autodiff<B>`.
pub fn dispatch_rows_autodiff<B: LowpBackend, C: CheckpointStrategy>(
    x: FloatTensor<Autodiff<B, C>>,
    routes: &TokenRoutes<B>,
) -> FloatTensor<Autodiff<B, C>> {
    let out = dispatch_rows::<B>(x.primitive.clone(), routes);
    match DispatchBackward.prepare::<C>([x.node.clone()]).compute_bound().stateful() {
        OpsKind::Tracked(prep) => prep.finish(routes.clone(), out),
        OpsKind::UnTracked(prep) => prep.finish(out),
    }
}

#[derive(Debug)]
struct CombineBackward;

impl<B: LowpBackend> Backward<B, 2> for CombineBackward {
    /// y (for the weights' gradient), the weights (for y's), the routes.
    type State = (Option<FloatTensor<B>>, Option<FloatTensor<B>>, TokenRoutes<B>);

    fn backward(self, ops: Ops<Self::State, 2>, grads: &mut Gradients, _: &mut Checkpointer) {
        let [node_y, node_w] = ops.parents;
        let (y, weights, routes) = ops.state;
        let dout = grads.consume::<B>(&ops.node);
        if let (Some(node), Some(y)) = (node_w, y) {
            let dw = B::lowp_combine_weights_grad(dout.clone(), y, &routes).expect("combine weights' gradient");
            grads.register::<B>(node.id, dw);
        }
        if let (Some(node), Some(w)) = (node_y, weights) {
            let dy = B::lowp_combine_rows_backward(dout, Some(w), &routes).expect("combine backward");
            grads.register::<B>(node.id, dy);
        }
    }
}

/// `combine_rows` on `Autodiff<B>`: keeps y only when the weights need a gradient, and the
/// weights only when y does.
pub fn combine_rows_autodiff<B: LowpBackend, C: CheckpointStrategy>(
    y: FloatTensor<Autodiff<B, C>>,
    weights: FloatTensor<Autodiff<B, C>>,
    routes: &TokenRoutes<B>,
) -> Result<FloatTensor<Autodiff<B, C>>> {
    let out = combine_rows::<B>(y.primitive.clone(), weights.primitive.clone(), routes)?;
    let keep_y = weights.is_tracked().then(|| y.primitive.clone());
    let keep_w = y.is_tracked().then(|| weights.primitive.clone());
    Ok(
        match CombineBackward.prepare::<C>([y.node.clone(), weights.node.clone()]).compute_bound().stateful() {
            OpsKind::Tracked(prep) => prep.finish((keep_y, keep_w, routes.clone()), out),
            OpsKind::UnTracked(prep) => prep.finish(out),
        },
    )
}
