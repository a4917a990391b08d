//! An MoE layer's token routing: the router's top-k choice, the stable sort of the `T·k`
//! assignments by expert (assignment `a = t·k + j` is token t's j-th choice), their rows in the
//! experts' aligned batch (`backend::grouped::GroupLayout`), and two differentiable moves:
//! `dispatch` (token rows into the aligned batch, one per assignment, zero padding) and
//! `combine` (each token's k expert rows weighted by the router and summed in f32).
//!
//! Each step is a backend op (`RoutingOps`): the CubeCL kernels
//! (`burn_lowp_kernels::token_routing`) do each in one or a few launches; the `*_reference`
//! functions beside the trait (`backend::ops::routing`) are the same steps in Burn tensor ops
//! (some forty launches per layer on a GPU), the defaults for the other backends and the
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
use burn::tensor::ops::FloatTensor;
use burn::tensor::{Int, Tensor, TensorPrimitive};

use super::LowpLinear;
pub use crate::backend::ops::routing::{
    combine_rows_backward_reference, combine_rows_reference, combine_weights_grad_reference,
    expert_positions_reference, route_rows_reference, top_k_reference,
};
use crate::backend::ops::routing::check_combine;
pub use crate::backend::routing::TokenRoutes;
use crate::backend::{GroupLayout, LowpBackend, RoutingOps};
use crate::error::{LowpError, Result};

fn float<B: burn::tensor::backend::Backend, const D: usize>(t: FloatTensor<B>) -> Tensor<B, D> {
    Tensor::from_primitive(TensorPrimitive::Float(t))
}

/// The experts chosen for each token, `[T, k]`, best first (ties to the lower expert), from
/// scores `[T, E]`; no gradient.
pub fn top_k<B: LowpLinear>(scores: Tensor<B, 2>, k: usize) -> Result<Tensor<B, 2, Int>> {
    let index = B::Quant::route_top_k(B::to_quant(scores.into_primitive().tensor()), k)?;
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
    let (m_splits, position) = B::Quant::route_expert_positions(expert, experts)?;
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
    B::Quant::route_rows(B::int_to_quant(position.into_primitive()), layout, k)
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
    B::grouped_gather_rows(x, routes.row_token.clone())
}

/// `combine` without autodiff.
pub fn combine_rows<B: LowpBackend>(
    y: FloatTensor<B>,
    weights: FloatTensor<B>,
    routes: &TokenRoutes<B>,
) -> Result<FloatTensor<B>> {
    check_combine::<B>(&y, Some(&weights), routes)?;
    B::route_combine_rows(y, Some(weights), routes)
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
            let dx = B::route_combine_rows(dy, None, &routes).expect("dispatch backward");
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
            let dw = B::route_combine_weights_grad(dout.clone(), y, &routes).expect("combine weights' gradient");
            grads.register::<B>(node.id, dw);
        }
        if let (Some(node), Some(w)) = (node_y, weights) {
            let dy = B::route_combine_rows_backward(dout, Some(w), &routes).expect("combine backward");
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
