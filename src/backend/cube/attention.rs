//! `AttentionOps` on `CubeBackend`: RoPE, the head split and merge (with RoPE on the rotated
//! parts) and the causal softmax with its gradient, one kernel each (`kernels::{rope, heads,
//! softmax}`); an odd sequence length takes the softmax's Burn-op reference.

use burn::tensor::ops::{FloatTensor, FloatTensorOps};
use burn::tensor::{DType, Shape, TensorMetadata};
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::{BoolElement, CubeBackend, CubeRuntime, FloatElement, IntElement};
use burn_lowp_kernels as kernels;
use kernels::norm::WordMatrix;

use super::buffers::{elem_kind, kernel_error, like, matrix, prepare};
use crate::backend::attention::{HeadLayout, RopePositions};
use crate::backend::ops::attention::{
    causal_softmax_backward_reference, causal_softmax_reference, check_parts, check_rope,
    check_rows, check_scores,
};
use crate::backend::{float_dtype, AttentionOps};
use crate::error::{LowpError, Result};

/// RoPE (`AttentionOps::attention_rope`) of `x [rows, head]`: one kernel; the frequencies are read
/// as f32.
fn rope<R: CubeRuntime>(
    x: CubeTensor<R>,
    freq: CubeTensor<R>,
    positions: RopePositions,
    inverse: bool,
) -> Result<CubeTensor<R>> {
    type B<R> = CubeBackend<R, f32, i32, u32>;
    let max_seq = check_rope::<B<R>>(&x, &freq, positions)?;
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

/// Attention's head split (`AttentionOps::attention_split_heads`): one kernel (`kernels::heads`).
fn split_heads<R: CubeRuntime>(
    x: CubeTensor<R>,
    freq: Option<CubeTensor<R>>,
    layout: HeadLayout,
) -> Result<Vec<CubeTensor<R>>> {
    type B<R> = CubeBackend<R, f32, i32, u32>;
    check_rows::<B<R>>(&x, &layout)?;
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
fn merge_heads<R: CubeRuntime>(
    parts: Vec<CubeTensor<R>>,
    freq: Option<CubeTensor<R>>,
    layout: HeadLayout,
) -> Result<CubeTensor<R>> {
    type B<R> = CubeBackend<R, f32, i32, u32>;
    check_parts::<B<R>>(&parts, &layout)?;
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

/// Attention's causal softmax (`AttentionOps::attention_causal_softmax`) of scores `x [rows, seq]`,
/// or with `backward = Some(dp)` its gradient from the softmax output `x` = p: one kernel each. An
/// odd `seq` (the kernels read pairs) takes the Burn-op reference.
fn causal_softmax<R: CubeRuntime>(
    x: CubeTensor<R>,
    backward: Option<CubeTensor<R>>,
    scale: f32,
) -> Result<CubeTensor<R>> {
    type B<R> = CubeBackend<R, f32, i32, u32>;
    let (rows, seq) = check_scores::<B<R>>(&x)?;
    if rows == 0 {
        return Ok(x);
    }
    if seq % 2 != 0 {
        return match backward {
            None => causal_softmax_reference::<B<R>>(x, scale),
            Some(dp) => causal_softmax_backward_reference::<B<R>>(x, dp, scale),
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
                B::<R>::float_cast(dp, float_dtype(x.dtype))
            };
            let dp = prepare(dp);
            kernels::softmax::causal_softmax_backward(&client, matrix, &dp.handle, scale)
        }
    }
    .map_err(kernel_error("attention scores"))?;
    Ok(like(&x, y, [rows, seq]))
}

impl<R: CubeRuntime, F: FloatElement, I: IntElement, BT: BoolElement> AttentionOps<Self>
    for CubeBackend<R, F, I, BT>
{
    fn attention_rope(
        x: FloatTensor<Self>,
        freq: FloatTensor<Self>,
        positions: RopePositions,
        inverse: bool,
    ) -> Result<FloatTensor<Self>> {
        rope(x, freq, positions, inverse)
    }

    fn attention_causal_softmax(x: FloatTensor<Self>, scale: f32) -> Result<FloatTensor<Self>> {
        causal_softmax(x, None, scale)
    }

    fn attention_split_heads(
        x: FloatTensor<Self>,
        freq: Option<FloatTensor<Self>>,
        layout: HeadLayout,
    ) -> Result<Vec<FloatTensor<Self>>> {
        split_heads(x, freq, layout)
    }

    fn attention_merge_heads(
        parts: Vec<FloatTensor<Self>>,
        freq: Option<FloatTensor<Self>>,
        layout: HeadLayout,
    ) -> Result<FloatTensor<Self>> {
        merge_heads(parts, freq, layout)
    }

    fn attention_causal_softmax_backward(
        p: FloatTensor<Self>,
        dp: FloatTensor<Self>,
        scale: f32,
    ) -> Result<FloatTensor<Self>> {
        causal_softmax(p, Some(dp), scale)
    }
}
