//! `NormOps` on `CubeBackend`: LayerNorm / RMSNorm forward and backward, one kernel each way
//! (`kernels::norm`), the forward also taking the output's amax for an FP8 current-scaling
//! quantizer (whose own quantize then skips its amax pass:
//! `QuantizeOps::quantize_fp8_current_with_amax`).

use burn::tensor::ops::FloatTensor;
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::{BoolElement, CubeBackend, CubeRuntime, FloatElement, IntElement};
use burn_lowp_kernels as kernels;
use kernels::norm::{NormConfig, WordMatrix};

use super::buffers::{bytes, elem_kind, f32_tensor, kernel_error, like, matrix, prepare, same_dtype};
use super::CubeBytes;
use crate::backend::{NormBackward, NormForward, NormOps, NormSpec};
use crate::error::Result;

fn norm_config(spec: &NormSpec, kind: kernels::ElemKind, beta: bool, amax: bool) -> NormConfig {
    NormConfig {
        kind,
        rms: spec.rms,
        zero_centered_gamma: spec.zero_centered_gamma,
        beta: beta && !spec.rms,
        amax,
    }
}

fn norm_forward<R: CubeRuntime>(
    x: CubeTensor<R>,
    gamma: CubeTensor<R>,
    beta: Option<CubeTensor<R>>,
    spec: &NormSpec,
    want_amax: bool,
) -> Result<NormForward<CubeTensor<R>, CubeBytes<R>>> {
    let (rows, cols) = matrix(&x, "norm input")?;
    let kind = elem_kind(x.dtype, "norm input")?;
    same_dtype(&gamma, x.dtype, "norm weight")?;
    if let Some(b) = &beta {
        same_dtype(b, x.dtype, "norm bias")?;
    }
    let x = prepare(x);
    let gamma = prepare(gamma);
    let beta = beta.map(prepare);
    let client = x.client.clone();
    let out = kernels::norm::norm_forward(
        &client,
        WordMatrix {
            handle: &x.handle,
            rows,
            cols,
            kind,
        },
        &gamma.handle,
        beta.as_ref().map(|b| &b.handle),
        spec.eps as f32,
        norm_config(spec, kind, beta.is_some(), want_amax),
    )
    .map_err(kernel_error("norm input"))?;
    Ok(NormForward {
        y: like(&x, out.y, [rows, cols]),
        mean: f32_tensor(&x, out.mean, vec![rows]),
        rstd: f32_tensor(&x, out.rstd, vec![rows]),
        amax: out.amax.map(|a| bytes(&client, &x.device, a, 4)),
    })
}

#[allow(clippy::too_many_arguments)]
fn norm_backward<R: CubeRuntime>(
    dy: CubeTensor<R>,
    x: CubeTensor<R>,
    gamma: CubeTensor<R>,
    mean: CubeTensor<R>,
    rstd: CubeTensor<R>,
    spec: &NormSpec,
    beta: bool,
) -> Result<NormBackward<CubeTensor<R>>> {
    let (rows, cols) = matrix(&dy, "norm grad_output")?;
    let kind = elem_kind(dy.dtype, "norm grad_output")?;
    same_dtype(&x, dy.dtype, "norm input")?;
    same_dtype(&gamma, dy.dtype, "norm weight")?;
    let (dy, x, gamma, mean, rstd) = (
        prepare(dy),
        prepare(x),
        prepare(gamma),
        prepare(mean),
        prepare(rstd),
    );
    let client = dy.client.clone();
    let out = kernels::norm::norm_backward(
        &client,
        WordMatrix {
            handle: &dy.handle,
            rows,
            cols,
            kind,
        },
        &x.handle,
        &gamma.handle,
        &mean.handle,
        &rstd.handle,
        norm_config(spec, kind, beta, false),
    )
    .map_err(kernel_error("norm grad_output"))?;
    Ok(NormBackward {
        dx: like(&dy, out.dx, [rows, cols]),
        dgamma: f32_tensor(&dy, out.dgamma, vec![cols]),
        dbeta: out.dbeta.map(|h| f32_tensor(&dy, h, vec![cols])),
    })
}

impl<R: CubeRuntime, F: FloatElement, I: IntElement, BT: BoolElement> NormOps<Self>
    for CubeBackend<R, F, I, BT>
{
    fn norm_forward(
        x: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        beta: Option<FloatTensor<Self>>,
        spec: &NormSpec,
        want_amax: bool,
    ) -> Result<NormForward<FloatTensor<Self>, CubeBytes<R>>> {
        norm_forward(x, gamma, beta, spec, want_amax)
    }

    fn norm_backward(
        dy: FloatTensor<Self>,
        x: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        mean: FloatTensor<Self>,
        rstd: FloatTensor<Self>,
        spec: &NormSpec,
        beta: bool,
    ) -> Result<NormBackward<FloatTensor<Self>>> {
        norm_backward(dy, x, gamma, mean, rstd, spec, beta)
    }
}
