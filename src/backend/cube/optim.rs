//! `OptimOps` on `CubeBackend`: one `burn_lowp_kernels::adamw` launch per parameter (after the
//! f32 sum of squares of the gradient when clipping). Odd element counts of 16-bit parameters (a
//! pair would straddle the tensor's end) and moments that are not f32 take the Burn-op reference
//! instead.

use burn::tensor::ops::FloatTensor;
use burn::tensor::{DType, Shape, TensorMetadata};
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::{BoolElement, CubeBackend, CubeRuntime, FloatElement, IntElement};
use burn_lowp_kernels as kernels;
use kernels::adamw::AdamWScalars;

use super::buffers::{elem_kind, prepare};
use crate::backend::ops::optim::{adamw_step_reference, min_positive};
use crate::backend::optim::{AdamWStep, AdamWTensors};
use crate::backend::OptimOps;

fn adamw_step<R, F, I, BT>(
    param: CubeTensor<R>,
    grad: CubeTensor<R>,
    moments: Option<(CubeTensor<R>, CubeTensor<R>)>,
    step: &AdamWStep,
) -> AdamWTensors<CubeTensor<R>>
where
    R: CubeRuntime,
    F: FloatElement,
    I: IntElement,
    BT: BoolElement,
{
    let n = param.shape().num_elements();
    let kinds = (elem_kind(param.dtype, "parameter"), elem_kind(grad.dtype, "gradient"));
    let f32_moments = moments.as_ref().is_none_or(|(m, v)| {
        m.dtype == DType::F32
            && v.dtype == DType::F32
            && m.shape().num_elements() == n
            && v.shape().num_elements() == n
    });
    let (Ok(param_kind), Ok(grad_kind)) = kinds else {
        return adamw_step_reference::<CubeBackend<R, F, I, BT>>(param, grad, moments, step);
    };
    if n % 2 != 0 || grad.shape().num_elements() != n || !f32_moments {
        return adamw_step_reference::<CubeBackend<R, F, I, BT>>(param, grad, moments, step);
    }
    let grad_dtype = grad.dtype;
    let (param, grad) = (prepare(param), prepare(grad));
    let moments = moments.map(|(m, v)| (prepare(m), prepare(v)));
    // Σ g² read straight from the gradient in its own dtype (`kernels::sum_squares`).
    let sum_squares = step
        .grad_clip_norm
        .map(|_| kernels::sum_squares::sum_squares(&grad.client, &grad.handle, n, grad_kind));
    let (correction_1, correction_2) = step.corrections();
    let scalars = AdamWScalars {
        lr: step.lr as f32,
        beta_1: step.beta_1,
        beta_2: step.beta_2,
        epsilon: step.epsilon,
        decay: step.decay(),
        correction_1,
        correction_2,
        clip_threshold: step.grad_clip_norm.unwrap_or(0.0),
        min_positive: min_positive(grad_dtype),
    };
    let out = kernels::adamw::adamw_step(
        &param.client,
        &param.handle,
        param_kind,
        &grad.handle,
        grad_kind,
        moments.as_ref().map(|(m, v)| (&m.handle, &v.handle)),
        sum_squares.as_ref(),
        n,
        scalars,
    );
    let tensor = |handle, dtype| {
        CubeTensor::new_contiguous(
            param.client.clone(),
            param.device.clone(),
            Shape::new([n]),
            handle,
            dtype,
        )
    };
    // The moments share one buffer (`kernels::adamw`): two views of it.
    let (m, v) = out.moments_views(n);
    AdamWTensors {
        param: tensor(out.param, param.dtype),
        moment_1: tensor(m, DType::F32),
        moment_2: tensor(v, DType::F32),
    }
}

impl<R: CubeRuntime, F: FloatElement, I: IntElement, BT: BoolElement> OptimOps<Self>
    for CubeBackend<R, F, I, BT>
{
    /// One kernel per parameter (`kernels::adamw`, above).
    fn optim_adamw_step(
        param: FloatTensor<Self>,
        grad: FloatTensor<Self>,
        moments: Option<(FloatTensor<Self>, FloatTensor<Self>)>,
        step: &AdamWStep,
    ) -> AdamWTensors<FloatTensor<Self>> {
        adamw_step::<R, F, I, BT>(param, grad, moments, step)
    }
}
