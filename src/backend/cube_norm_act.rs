//! `LowpBackend`'s norm and activation passes on `CubeBackend` (`norm_act`), through the kernels
//! of `burn_lowp_kernels::{norm, activation}`. The quantize that takes their fused amax is
//! `cube.rs`'s own (`quantize_plain`).

use burn::tensor::{DType, Shape, TensorMetadata};
use burn_cubecl::tensor::CubeTensor;
use burn::tensor::ops::FloatTensorOps;
use burn_cubecl::{CubeBackend, CubeRuntime};
use burn_lowp_kernels as kernels;
use kernels::cubecl::prelude::ComputeClient;
use kernels::activation::ActivationConfig;
use kernels::norm::{NormConfig, WordMatrix};

use super::cube::{bytes, elem_kind, kernel_error, prepare, CubeBytes};
use super::norm_act::{ActivationOutput, NormBackward, NormForward, NormSpec};
use crate::error::{LowpError, Result};
use crate::backend::activation::ActivationSpec;

fn matrix<R: CubeRuntime>(t: &CubeTensor<R>, what: &str) -> Result<(usize, usize)> {
    let dims = t.shape().as_slice().to_vec();
    if dims.len() != 2 {
        return Err(LowpError::shape(
            what,
            format!("{dims:?}"),
            "the LayerNormMLP passes take [rows, cols] matrices",
        ));
    }
    Ok((dims[0], dims[1]))
}

fn same_dtype<R: CubeRuntime>(t: &CubeTensor<R>, dtype: DType, what: &str) -> Result<()> {
    if t.dtype != dtype {
        return Err(LowpError::Dtype {
            tensor: what.to_string(),
            dtype: format!("{:?}", t.dtype),
            supported: format!("the input's dtype {dtype:?}"),
        });
    }
    Ok(())
}

pub(super) fn f32_tensor<R: CubeRuntime>(
    like: &CubeTensor<R>,
    handle: kernels::cubecl::server::Handle,
    shape: Vec<usize>,
) -> CubeTensor<R> {
    CubeTensor::new_contiguous(
        like.client.clone(),
        like.device.clone(),
        Shape::from(shape),
        handle,
        DType::F32,
    )
}

pub(super) fn like<R: CubeRuntime>(
    t: &CubeTensor<R>,
    handle: kernels::cubecl::server::Handle,
    shape: [usize; 2],
) -> CubeTensor<R> {
    CubeTensor::new_contiguous(
        t.client.clone(),
        t.device.clone(),
        Shape::new(shape),
        handle,
        t.dtype,
    )
}

fn norm_config(spec: &NormSpec, kind: kernels::ElemKind, beta: bool, amax: bool) -> NormConfig {
    NormConfig {
        kind,
        rms: spec.rms,
        zero_centered_gamma: spec.zero_centered_gamma,
        beta: beta && !spec.rms,
        amax,
    }
}

pub(super) fn norm_forward<R: CubeRuntime>(
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
pub(super) fn norm_backward<R: CubeRuntime>(
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
        clamped_gate: spec.activation == crate::backend::activation::Activation::ClampedSwiglu,
        amax,
        dbias,
        encoder: kernels::fp8_encoder(client),
    }
}

pub(super) fn activation_forward<R: CubeRuntime>(
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

pub(super) fn activation_backward<R: CubeRuntime>(
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
pub(super) fn dbias_amax<R: CubeRuntime>(
    dy: CubeTensor<R>,
) -> Result<(CubeTensor<R>, Option<CubeBytes<R>>)> {
    type B<R> = CubeBackend<R, f32, i32, u32>;
    let (rows, cols) = matrix(&dy, "dbias grad_output")?;
    let kind = match elem_kind(dy.dtype, "dbias grad_output") {
        Ok(kind) if rows > 0 && cols > 0 && cols % 2 == 0 && rows * cols < u32::MAX as usize => kind,
        _ => return Ok((crate::ops::row_broadcast::column_sum::<B<R>>(dy), None)),
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

/// RoPE (`ops/rope_op.rs`) of `x [rows, head]`: one kernel; the frequencies are read as f32.
pub(super) fn rope<R: CubeRuntime>(
    x: CubeTensor<R>,
    freq: CubeTensor<R>,
    positions: crate::backend::attention::RopePositions,
    inverse: bool,
) -> Result<CubeTensor<R>> {
    type B<R> = CubeBackend<R, f32, i32, u32>;
    let max_seq = crate::ops::rope_op::check_rope::<B<R>>(&x, &freq, positions)?;
    let (rows, head) = matrix(&x, "RoPE input")?;
    if rows == 0 {
        return Ok(x);
    }
    let kind = elem_kind(x.dtype, "RoPE input")?;
    let freq = if freq.dtype == DType::F32 {
        freq
    } else {
        B::<R>::float_cast(freq, burn::tensor::FloatDType::F32)
    };
    let (x, freq) = (prepare(x), prepare(freq));
    let client = x.client.clone();
    let y = kernels::rope::rope(
        &client,
        WordMatrix {
            handle: &x.handle,
            rows,
            cols: head,
            kind,
        },
        &freq.handle,
        max_seq,
        positions.seq,
        positions.start,
        inverse,
    )
    .map_err(kernel_error("RoPE input"))?;
    Ok(like(&x, y, [rows, head]))
}

/// The frequency table as f32 words and its row count, checked against a head size.
fn rope_table<R: CubeRuntime>(freq: CubeTensor<R>, head: usize) -> Result<(CubeTensor<R>, usize)> {
    type B<R> = CubeBackend<R, f32, i32, u32>;
    let dims = freq.shape().as_slice().to_vec();
    let rows = match dims.as_slice() {
        [rows, h, 2] if *h == head => *rows,
        _ => {
            return Err(LowpError::shape(
                "RoPE frequencies",
                format!("{dims:?}"),
                format!("Burn's freq_complex [max_seq, {head}, 2]"),
            ))
        }
    };
    let freq = if freq.dtype == DType::F32 {
        freq
    } else {
        B::<R>::float_cast(freq, burn::tensor::FloatDType::F32)
    };
    Ok((prepare(freq), rows))
}

/// Attention's head split (`ops/attention_op.rs`): one kernel (`kernels::heads`).
pub(super) fn split_heads<R: CubeRuntime>(
    x: CubeTensor<R>,
    freq: Option<CubeTensor<R>>,
    layout: crate::backend::attention::HeadLayout,
) -> Result<Vec<CubeTensor<R>>> {
    type B<R> = CubeBackend<R, f32, i32, u32>;
    crate::ops::attention_op::check_rows::<B<R>>(&x, &layout)?;
    let kind = elem_kind(x.dtype, "attention rows")?;
    let freq = freq.map(|f| rope_table(f, layout.head)).transpose()?;
    let x = prepare(x);
    let parts = kernels::heads::split_heads(
        &x.client,
        &x.handle,
        kind,
        freq.as_ref().map(|(f, rows)| (&f.handle, *rows)),
        layout,
    )
    .map_err(kernel_error("attention rows"))?;
    let shape = [layout.batch * layout.heads, layout.seq, layout.head];
    Ok(parts
        .into_iter()
        .map(|h| CubeTensor::new_contiguous(x.client.clone(), x.device.clone(), Shape::new(shape), h, x.dtype))
        .collect())
}

/// `split_heads` transposed: one kernel (`kernels::heads`).
pub(super) fn merge_heads<R: CubeRuntime>(
    parts: Vec<CubeTensor<R>>,
    freq: Option<CubeTensor<R>>,
    layout: crate::backend::attention::HeadLayout,
) -> Result<CubeTensor<R>> {
    type B<R> = CubeBackend<R, f32, i32, u32>;
    crate::ops::attention_op::check_parts::<B<R>>(&parts, &layout)?;
    let kind = elem_kind(parts[0].dtype, "attention heads")?;
    let freq = freq.map(|f| rope_table(f, layout.head)).transpose()?;
    let parts: Vec<CubeTensor<R>> = parts.into_iter().map(prepare).collect();
    let handles: Vec<&kernels::cubecl::server::Handle> = parts.iter().map(|p| &p.handle).collect();
    let first = &parts[0];
    let rows = kernels::heads::merge_heads(
        &first.client,
        &handles,
        kind,
        freq.as_ref().map(|(f, rows)| (&f.handle, *rows)),
        layout,
    )
    .map_err(kernel_error("attention heads"))?;
    let shape = [layout.batch * layout.seq, layout.parts * layout.heads * layout.head];
    Ok(like(first, rows, shape))
}

/// Attention's causal softmax (`ops/softmax_op.rs`) of scores `x [rows, seq]`, or with
/// `backward = Some(dp)` its gradient from the softmax output `x` = p: one kernel each. An odd
/// `seq` (the kernels read pairs) takes the Burn-op reference.
pub(super) fn causal_softmax<R: CubeRuntime>(
    x: CubeTensor<R>,
    backward: Option<CubeTensor<R>>,
    scale: f32,
) -> Result<CubeTensor<R>> {
    type B<R> = CubeBackend<R, f32, i32, u32>;
    let (rows, seq) = crate::ops::softmax_op::check_scores::<B<R>>(&x)?;
    if rows == 0 {
        return Ok(x);
    }
    if seq % 2 != 0 {
        return match backward {
            None => crate::ops::softmax_op::causal_softmax_reference::<B<R>>(x, scale),
            Some(dp) => crate::ops::softmax_op::causal_softmax_backward_reference::<B<R>>(x, dp, scale),
        };
    }
    let kind = elem_kind(x.dtype, "attention scores")?;
    let x = prepare(x);
    let client = x.client.clone();
    let matrix = WordMatrix {
        handle: &x.handle,
        rows,
        cols: seq,
        kind,
    };
    let y = match backward {
        None => kernels::softmax::causal_softmax(&client, matrix, scale),
        Some(dp) => {
            let dp = if dp.dtype == x.dtype {
                dp
            } else {
                B::<R>::float_cast(dp, super::float_dtype(x.dtype))
            };
            let dp = prepare(dp);
            kernels::softmax::causal_softmax_backward(&client, matrix, &dp.handle, scale)
        }
    }
    .map_err(kernel_error("attention scores"))?;
    Ok(like(&x, y, [rows, seq]))
}
