//! `RoutingOps` on `CubeBackend`: an MoE layer's token routing through the kernels of
//! `burn_lowp_kernels::token_routing`, one or a few launches per step. Int tensors go to the
//! kernels as i32 and come back in the backend's Int dtype; shapes the kernels do not take (odd
//! widths, mixed dtypes) run the Burn-op references.

use burn::tensor::backend::Backend;
use burn::tensor::ops::{FloatTensor, FloatTensorOps, IntTensor, IntTensorOps};
use burn::tensor::{DType, FloatDType, IntDType, Shape, TensorMetadata};
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::{BoolElement, CubeBackend, CubeRuntime, FloatElement, IntElement};
use burn_lowp_kernels as kernels;
use kernels::cubecl::server::Handle;
use kernels::norm::WordMatrix;
use kernels::token_routing as routing;

use super::buffers::{elem_kind, f32_tensor, kernel_error, like, prepare};
use crate::backend::ops::routing::{
    check_assignments, check_routes, check_top_k, combine_rows_backward_reference,
    combine_rows_reference, combine_weights_grad_reference,
};
use crate::backend::{GroupLayout, LowpBackend, RoutingOps, TokenRoutes};
use crate::error::Result;

/// Casts and layout helpers, whatever the backend's element types.
type Plain<R> = CubeBackend<R, f32, i32, u32>;

/// The backends whose tensors are `CubeTensor<R>`.
trait CubeTensors<R: CubeRuntime>:
    LowpBackend + Backend<FloatTensorPrimitive = CubeTensor<R>, IntTensorPrimitive = CubeTensor<R>>
{
}

impl<R: CubeRuntime, T> CubeTensors<R> for T where
    T: LowpBackend + Backend<FloatTensorPrimitive = CubeTensor<R>, IntTensorPrimitive = CubeTensor<R>>
{
}

fn i32_contiguous<R: CubeRuntime>(t: CubeTensor<R>) -> CubeTensor<R> {
    if t.dtype == DType::I32 {
        into_contiguous(t)
    } else {
        into_contiguous(Plain::<R>::int_cast(t, IntDType::I32))
    }
}

fn f32_prepared<R: CubeRuntime>(t: CubeTensor<R>) -> CubeTensor<R> {
    if t.dtype == DType::F32 {
        prepare(t)
    } else {
        prepare(Plain::<R>::float_cast(t, FloatDType::F32))
    }
}

/// An i32 result as an Int tensor of `int`.
fn int_tensor<R: CubeRuntime>(like: &CubeTensor<R>, handle: Handle, shape: Vec<usize>, int: DType) -> CubeTensor<R> {
    let t = CubeTensor::new_contiguous(like.client.clone(), like.device.clone(), Shape::from(shape), handle, DType::I32);
    if int == DType::I32 {
        t
    } else {
        Plain::<R>::int_cast(t, IntDType::from(int))
    }
}

fn dims2<R: CubeRuntime>(t: &CubeTensor<R>) -> (usize, usize) {
    let dims = t.shape().as_slice().to_vec();
    (dims[0], dims.get(1).copied().unwrap_or(0))
}

fn top_k<R: CubeRuntime, B: CubeTensors<R>>(scores: CubeTensor<R>, k: usize, int: DType) -> Result<CubeTensor<R>> {
    let (tokens, experts) = check_top_k::<B>(&scores, k)?;
    let scores = f32_prepared(scores);
    let index = routing::top_k(&scores.client, &scores.handle, tokens, experts, k)
        .map_err(kernel_error("router scores"))?;
    Ok(int_tensor(&scores, index, vec![tokens, k], int))
}

fn expert_positions<R: CubeRuntime, B: CubeTensors<R>>(
    expert: CubeTensor<R>,
    experts: usize,
    int: DType,
) -> Result<(CubeTensor<R>, CubeTensor<R>)> {
    let n = check_assignments::<B>(&expert, experts)?;
    let expert = i32_contiguous(expert);
    let (m_splits, position) = routing::expert_positions(&expert.client, &expert.handle, n, experts)
        .map_err(kernel_error("assignments' experts"))?;
    Ok((
        int_tensor(&expert, m_splits, vec![experts], int),
        int_tensor(&expert, position, vec![n], int),
    ))
}

fn route_rows<R: CubeRuntime, B: CubeTensors<R>>(
    position: CubeTensor<R>,
    layout: &GroupLayout<B>,
    k: usize,
    int: DType,
) -> Result<TokenRoutes<B>> {
    let n = check_routes::<B>(&position, layout, k)?;
    let position = i32_contiguous(position);
    let packed_to_aligned = i32_contiguous(layout.packed_to_aligned.clone());
    let aligned_to_packed = i32_contiguous(layout.aligned_to_packed.clone());
    let rows = layout.rows();
    let (assignment_row, row_assignment, row_token) = routing::route_rows(
        &position.client,
        &position.handle,
        &packed_to_aligned.handle,
        &aligned_to_packed.handle,
        n,
        k,
        rows,
    )
    .map_err(kernel_error("assignments' positions"))?;
    Ok(TokenRoutes {
        tokens: n / k,
        top_k: k,
        rows,
        assignment_row: int_tensor(&position, assignment_row, vec![n], int),
        row_assignment: int_tensor(&position, row_assignment, vec![rows], int),
        row_token: int_tensor(&position, row_token, vec![rows], int),
    })
}

/// Whether the row kernels take a `[_, cols]` matrix of `dtype`.
fn row_kernels_take(cols: usize, dtype: DType) -> bool {
    cols % 2 == 0 && matches!(dtype, DType::F32 | DType::F16 | DType::BF16)
}

fn combine<R: CubeRuntime, B: CubeTensors<R>>(
    y: CubeTensor<R>,
    weights: Option<CubeTensor<R>>,
    routes: &TokenRoutes<B>,
) -> Result<CubeTensor<R>> {
    let (rows, cols) = dims2(&y);
    if rows != routes.rows || !row_kernels_take(cols, y.dtype) {
        return combine_rows_reference::<B>(y, weights, routes);
    }
    if let Some(w) = &weights {
        if w.shape().as_slice() != &[routes.tokens, routes.top_k][..] {
            return combine_rows_reference::<B>(y, weights, routes);
        }
    }
    let kind = elem_kind(y.dtype, "expert rows")?;
    let y = prepare(y);
    let weights = weights.map(f32_prepared);
    let assignment_row = i32_contiguous(routes.assignment_row.clone());
    let matrix = WordMatrix { handle: &y.handle, rows, cols, kind };
    let out = routing::combine_rows(
        &y.client,
        matrix,
        weights.as_ref().map(|w| &w.handle),
        &assignment_row.handle,
        routes.tokens,
        routes.top_k,
    )
    .map_err(kernel_error("expert rows"))?;
    Ok(like(&y, out, [routes.tokens, cols]))
}

fn combine_backward<R: CubeRuntime, B: CubeTensors<R>>(
    dout: CubeTensor<R>,
    weights: Option<CubeTensor<R>>,
    routes: &TokenRoutes<B>,
) -> Result<CubeTensor<R>> {
    let (tokens, cols) = dims2(&dout);
    if tokens != routes.tokens || !row_kernels_take(cols, dout.dtype) {
        return combine_rows_backward_reference::<B>(dout, weights, routes);
    }
    let kind = elem_kind(dout.dtype, "combined rows' gradient")?;
    let dout = prepare(dout);
    let weights = weights.map(f32_prepared);
    let row_assignment = i32_contiguous(routes.row_assignment.clone());
    let matrix = WordMatrix { handle: &dout.handle, rows: tokens, cols, kind };
    let dy = routing::combine_rows_backward(
        &dout.client,
        matrix,
        weights.as_ref().map(|w| &w.handle),
        &row_assignment.handle,
        routes.top_k,
        routes.rows,
    )
    .map_err(kernel_error("combined rows' gradient"))?;
    Ok(like(&dout, dy, [routes.rows, cols]))
}

fn combine_weights_grad<R: CubeRuntime, B: CubeTensors<R>>(
    dout: CubeTensor<R>,
    y: CubeTensor<R>,
    routes: &TokenRoutes<B>,
) -> Result<CubeTensor<R>> {
    let (tokens, cols) = dims2(&dout);
    let (rows, y_cols) = dims2(&y);
    if tokens != routes.tokens
        || rows != routes.rows
        || y_cols != cols
        || y.dtype != dout.dtype
        || !row_kernels_take(cols, dout.dtype)
    {
        return combine_weights_grad_reference::<B>(dout, y, routes);
    }
    let kind = elem_kind(dout.dtype, "combined rows' gradient")?;
    let (dout, y) = (prepare(dout), prepare(y));
    let assignment_row = i32_contiguous(routes.assignment_row.clone());
    let matrix = WordMatrix { handle: &dout.handle, rows: tokens, cols, kind };
    let dw = routing::combine_weights_grad(&dout.client, matrix, &y.handle, rows, &assignment_row.handle, routes.top_k)
        .map_err(kernel_error("combined rows' gradient"))?;
    Ok(f32_tensor(&dout, dw, vec![tokens, routes.top_k]))
}

impl<R: CubeRuntime, F: FloatElement, I: IntElement, BT: BoolElement> RoutingOps<Self>
    for CubeBackend<R, F, I, BT>
{
    fn route_top_k(scores: FloatTensor<Self>, k: usize) -> Result<IntTensor<Self>> {
        top_k::<R, Self>(scores, k, I::dtype())
    }

    fn route_expert_positions(
        expert: IntTensor<Self>,
        experts: usize,
    ) -> Result<(IntTensor<Self>, IntTensor<Self>)> {
        expert_positions::<R, Self>(expert, experts, I::dtype())
    }

    fn route_rows(
        position: IntTensor<Self>,
        layout: &GroupLayout<Self>,
        k: usize,
    ) -> Result<TokenRoutes<Self>> {
        route_rows::<R, Self>(position, layout, k, I::dtype())
    }

    fn route_combine_rows(
        y: FloatTensor<Self>,
        weights: Option<FloatTensor<Self>>,
        routes: &TokenRoutes<Self>,
    ) -> Result<FloatTensor<Self>> {
        combine::<R, Self>(y, weights, routes)
    }

    fn route_combine_rows_backward(
        dout: FloatTensor<Self>,
        weights: Option<FloatTensor<Self>>,
        routes: &TokenRoutes<Self>,
    ) -> Result<FloatTensor<Self>> {
        combine_backward::<R, Self>(dout, weights, routes)
    }

    fn route_combine_weights_grad(
        dout: FloatTensor<Self>,
        y: FloatTensor<Self>,
        routes: &TokenRoutes<Self>,
    ) -> Result<FloatTensor<Self>> {
        combine_weights_grad::<R, Self>(dout, y, routes)
    }
}
