//! `ActivationOps` on `CubeBackend`: the activation forward and backward (`kernels::activation`),
//! each one pass that also takes the output's amax and the bias gradient where asked; the FP8
//! casts with the activation as their prologue (`kernels::quantize_fp8_tensor_activated*`); and a
//! Linear's bias gradient with dY's amax in one read (`kernels::dbias_amax`).

use burn::tensor::ops::FloatTensor;
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::{BoolElement, CubeBackend, CubeRuntime, FloatElement, IntElement};
use burn_lowp_kernels as kernels;
use kernels::activation::ActivationConfig;
use kernels::cubecl::prelude::ComputeClient;
use kernels::norm::WordMatrix;

use super::buffers::{bytes, elem_kind, f32_tensor, kernel_error, like, matrix, prepare, same_dtype};
use super::cast::{activated_fp8_cast, current_scaling_rule, fp8_kind, history_row, StateTarget};
use super::CubeBytes;
use crate::backend::activation::{Activation, ActivationOutput, ActivationSpec};
use crate::backend::ops::rows::column_sum;
use crate::backend::{ActivationOps, AmaxHistoryColumns, QuantizedTensor, ScaleColumns};
use crate::error::{LowpError, Result};
use crate::format::{FormatConfig, Fp8Format, Usage};

fn activation_config<R: CubeRuntime>(
    client: &ComputeClient<R>,
    spec: &ActivationSpec,
    kind: kernels::ElemKind,
    amax: bool,
    dbias: bool,
) -> ActivationConfig {
    ActivationConfig {
        kind,
        act: spec.activation.function(),
        gated: spec.activation.is_gated(),
        clamped_gate: spec.activation == Activation::ClampedSwiglu,
        amax,
        dbias,
        encoder: kernels::fp8_encoder(client),
    }
}

fn activation_forward<R: CubeRuntime>(
    h: CubeTensor<R>,
    spec: &ActivationSpec,
    want_amax: bool,
) -> Result<ActivationOutput<CubeTensor<R>, CubeBytes<R>>> {
    let (rows, cols) = matrix(&h, "activation input")?;
    let kind = elem_kind(h.dtype, "activation input")?;
    let h = prepare(h);
    let client = h.client.clone();
    let (y, amax) = kernels::activation::activation_forward(
        &client,
        WordMatrix {
            handle: &h.handle,
            rows,
            cols,
            kind,
        },
        spec.kernel_params(),
        activation_config(&client, spec, kind, want_amax, false),
    )
    .map_err(kernel_error("activation input"))?;
    let out_cols = if spec.activation.is_gated() { cols / 2 } else { cols };
    Ok(ActivationOutput {
        y: like(&h, y, [rows, out_cols]),
        amax: amax.map(|a| bytes(&client, &h.device, a, 4)),
        dbias: None,
    })
}

fn activation_backward<R: CubeRuntime>(
    dy: CubeTensor<R>,
    h: CubeTensor<R>,
    spec: &ActivationSpec,
    want_amax: bool,
    want_dbias: bool,
) -> Result<ActivationOutput<CubeTensor<R>, CubeBytes<R>>> {
    let (rows, cols) = matrix(&dy, "activation grad_output")?;
    let kind = elem_kind(dy.dtype, "activation grad_output")?;
    same_dtype(&h, dy.dtype, "activation input")?;
    let (h_rows, h_cols) = matrix(&h, "activation input")?;
    let expected = if spec.activation.is_gated() { 2 * cols } else { cols };
    if h_rows != rows || h_cols != expected {
        return Err(LowpError::shape(
            "activation input",
            format!("[{h_rows}, {h_cols}]"),
            format!("must be [{rows}, {expected}] for a grad_output [{rows}, {cols}] of {}", spec.activation),
        ));
    }
    let (dy, h) = (prepare(dy), prepare(h));
    let client = dy.client.clone();
    let out = kernels::activation::activation_backward(
        &client,
        WordMatrix {
            handle: &dy.handle,
            rows,
            cols,
            kind,
        },
        &h.handle,
        spec.kernel_params(),
        activation_config(&client, spec, kind, want_amax, want_dbias),
    )
    .map_err(kernel_error("activation grad_output"))?;
    Ok(ActivationOutput {
        y: like(&dy, out.dh, [rows, h_cols]),
        amax: out.amax.map(|a| bytes(&client, &dy.device, a, 4)),
        dbias: out.dbias.map(|d| f32_tensor(&dy, d, vec![h_cols])),
    })
}

/// A Linear's f32 bias gradient and dY's amax in one read (`kernels::dbias_amax`); Burn's
/// column sums without an amax where the kernel does not apply (odd widths, empty or 2^32
/// elements and more, a dtype it does not read).
fn dbias_amax<R: CubeRuntime>(
    dy: CubeTensor<R>,
) -> Result<(CubeTensor<R>, Option<CubeBytes<R>>)> {
    type B<R> = CubeBackend<R, f32, i32, u32>;
    let (rows, cols) = matrix(&dy, "dbias grad_output")?;
    let kind = match elem_kind(dy.dtype, "dbias grad_output") {
        Ok(kind) if rows > 0 && cols > 0 && cols % 2 == 0 && rows * cols < u32::MAX as usize => kind,
        _ => return Ok((column_sum::<B<R>>(dy), None)),
    };
    let dy = prepare(dy);
    let client = dy.client.clone();
    let (dbias, amax) = kernels::dbias_amax::dbias_and_amax(
        &client,
        WordMatrix {
            handle: &dy.handle,
            rows,
            cols,
            kind,
        },
    )
    .map_err(kernel_error("dbias grad_output"))?;
    Ok((f32_tensor(&dy, dbias, vec![cols]), Some(bytes(&client, &dy.device, amax, 4))))
}

impl<R: CubeRuntime, F: FloatElement, I: IntElement, BT: BoolElement> ActivationOps<Self>
    for CubeBackend<R, F, I, BT>
{
    fn act_forward(
        h: FloatTensor<Self>,
        spec: &ActivationSpec,
        want_amax: bool,
    ) -> Result<ActivationOutput<FloatTensor<Self>, CubeBytes<R>>> {
        activation_forward(h, spec, want_amax)
    }

    /// One launch of the FP8 cast with the activation as its prologue
    /// (`kernels::quantize_fp8_tensor_activated`).
    fn act_quantize_fp8_with_scale(
        h: FloatTensor<Self>,
        spec: &ActivationSpec,
        fp8: Fp8Format,
        scale: ScaleColumns<Self>,
        usage: Usage,
        record: Option<AmaxHistoryColumns<Self>>,
    ) -> Result<Option<QuantizedTensor<Self>>> {
        let history = history_row(record, 1)?;
        let scale = StateTarget::scales(scale, 1)?;
        activated_fp8_cast::<R, Self>(h, spec, fp8, usage, |client, input, prologue, directions| {
            kernels::quantize_fp8_tensor_activated(
                client,
                input,
                prologue,
                fp8_kind(fp8),
                scale.kernel_arg(),
                history.as_ref().map(|h| h.kernel_arg()),
                directions,
            )
        })
    }

    /// An amax pass over the activation and the FP8 cast with the activation as its prologue
    /// (`kernels::quantize_fp8_tensor_activated_current`).
    fn act_quantize_fp8_current(
        h: FloatTensor<Self>,
        spec: &ActivationSpec,
        config: &FormatConfig,
        usage: Usage,
    ) -> Result<Option<QuantizedTensor<Self>>> {
        let FormatConfig::Fp8Current(c) = config else {
            return Ok(None);
        };
        let rule = current_scaling_rule(c);
        activated_fp8_cast::<R, Self>(h, spec, c.fp8, usage, |client, input, prologue, directions| {
            kernels::quantize_fp8_tensor_activated_current(client, input, prologue, rule, directions)
        })
    }

    fn act_dbias_amax(dy: FloatTensor<Self>) -> Result<(FloatTensor<Self>, Option<CubeBytes<R>>)> {
        dbias_amax(dy)
    }

    fn act_backward(
        dy: FloatTensor<Self>,
        h: FloatTensor<Self>,
        spec: &ActivationSpec,
        want_amax: bool,
        want_dbias: bool,
    ) -> Result<ActivationOutput<FloatTensor<Self>, CubeBytes<R>>> {
        activation_backward(dy, h, spec, want_amax, want_dbias)
    }
}
