//! `AttentionOps`: the attention passes burn-lowp runs as one kernel each on CubeCL backends:
//! rotary position embedding (RoPE, as Burn's `RotaryEncoding` computes it) and its inverse,
//! the head split and merge of token rows (with RoPE on the rotated parts), and the causal
//! softmax and its gradient. The defaults are their formulas in Burn ops in f32 (below), which
//! NdArray runs and the kernels are tested against; the differentiable ops built on them are
//! `ops::{rope_op, attention_op, softmax_op}`.

use burn::tensor::ops::FloatTensor;
use burn::tensor::{Bool, FloatDType, Int, Shape, Tensor, TensorMetadata, TensorPrimitive};

use crate::backend::attention::{HeadLayout, RopePositions};
use crate::backend::LowpBackend;
use crate::error::{LowpError, Result};

pub trait AttentionOps<B: LowpBackend> {
    /// Rotary position embedding of `x [rows, head]` with Burn's `freq_complex [max_seq, head, 2]`
    /// (`ops/rope_op.rs`); `inverse` gives its gradient. The default runs the formula with Burn
    /// ops in f32 (`rope_reference`); CubeCL backends run one kernel.
    fn attention_rope(
        x: FloatTensor<B>,
        freq: FloatTensor<B>,
        positions: RopePositions,
        inverse: bool,
    ) -> Result<FloatTensor<B>> {
        rope_reference::<B>(x, freq, positions, inverse)
    }

    /// Attention's head split (`ops/attention_op.rs`): the parts of token rows `x [batch · seq,
    /// parts · heads · head]` as `[batch · heads, seq, head]` tensors, the first
    /// `layout.rope_parts` rotated with `freq` (Burn's `freq_complex`). The default runs Burn's
    /// reshape, swap and narrow and `attention_rope` (`split_heads_reference`); CubeCL backends
    /// one kernel (`kernels::heads`).
    fn attention_split_heads(
        x: FloatTensor<B>,
        freq: Option<FloatTensor<B>>,
        layout: HeadLayout,
    ) -> Result<Vec<FloatTensor<B>>> {
        split_heads_reference::<B>(x, freq, layout)
    }

    /// `attention_split_heads` transposed: the parts back into token rows, the first
    /// `layout.rope_parts` through RoPE's gradient.
    fn attention_merge_heads(
        parts: Vec<FloatTensor<B>>,
        freq: Option<FloatTensor<B>>,
        layout: HeadLayout,
    ) -> Result<FloatTensor<B>> {
        merge_heads_reference::<B>(parts, freq, layout)
    }

    /// Attention's causal softmax of `scale · x` for scores `x [rows, seq]`, whole `[seq, seq]`
    /// blocks of query rows (`ops/softmax_op.rs`). The default runs the formula with Burn ops in
    /// f32 (`causal_softmax_reference`); CubeCL backends run one kernel.
    fn attention_causal_softmax(x: FloatTensor<B>, scale: f32) -> Result<FloatTensor<B>> {
        causal_softmax_reference::<B>(x, scale)
    }

    /// The gradient of `attention_causal_softmax` with respect to its scores, from its output
    /// `p` and the output's gradient `dp`: `scale · p · (dp - Σ p · dp)` per row.
    fn attention_causal_softmax_backward(
        p: FloatTensor<B>,
        dp: FloatTensor<B>,
        scale: f32,
    ) -> Result<FloatTensor<B>> {
        causal_softmax_backward_reference::<B>(p, dp, scale)
    }
}

fn float<B: LowpBackend, const D: usize>(t: FloatTensor<B>) -> Tensor<B, D> {
    Tensor::from_primitive(TensorPrimitive::Float(t))
}

/// Checks `x [rows, head]` and `freq [max_seq, head, 2]` against `positions`; the table's length.
pub(crate) fn check_rope<B: LowpBackend>(
    x: &FloatTensor<B>,
    freq: &FloatTensor<B>,
    positions: RopePositions,
) -> Result<usize> {
    let (xs, fs) = (x.shape().as_slice().to_vec(), freq.shape().as_slice().to_vec());
    let RopePositions { seq, start } = positions;
    let ok = xs.len() == 2
        && fs.len() == 3
        && fs[1] == xs[1]
        && fs[2] == 2
        && xs[1] % 2 == 0
        && seq > 0
        && xs[0] % seq == 0
        && start + seq <= fs[0];
    if !ok {
        return Err(LowpError::shape(
            "RoPE input",
            format!("x {xs:?}, frequencies {fs:?}, sequence length {seq} from position {start}"),
            "x is [rows, head] with an even head and whole sequences of rows, the frequencies \
             [max_seq, head, 2] with start + seq <= max_seq",
        ));
    }
    Ok(fs[0])
}

/// The reference of `AttentionOps::attention_rope` with Burn ops, in f32 (the default for backends
/// without the kernel). On f32 inputs it equals Burn's `RotaryEncoding` bit for bit: its sign
/// matmul only copies and negates, and its sum of two products is the same difference.
pub fn rope_reference<B: LowpBackend>(
    x: FloatTensor<B>,
    freq: FloatTensor<B>,
    positions: RopePositions,
    inverse: bool,
) -> Result<FloatTensor<B>> {
    check_rope::<B>(&x, &freq, positions)?;
    let RopePositions { seq, start } = positions;
    let x: Tensor<B, 2> = Tensor::from_primitive(TensorPrimitive::Float(x));
    let dtype = x.dtype();
    let [rows, head] = x.dims();
    let pairs = x.cast(FloatDType::F32).reshape([rows / seq, seq, head / 2, 2]);
    let (a, b) = (pairs.clone().narrow(3, 0, 1), pairs.narrow(3, 1, 1));
    let freq: Tensor<B, 3> = Tensor::from_primitive(TensorPrimitive::Float(freq));
    // [seq, head / 2, (element of the pair), (cos, sin)]
    let f = freq
        .cast(FloatDType::F32)
        .slice([start..start + seq])
        .reshape([1, seq, head / 2, 4]);
    let part = |i: usize| f.clone().narrow(3, i, 1);
    let (cos0, sin0, cos1, sin1) = (part(0), part(1), part(2), part(3));
    let (ya, yb) = if inverse {
        (a.clone() * cos0 + b.clone() * sin1, b * cos1 - a * sin0)
    } else {
        (a.clone() * cos0 - b.clone() * sin0, b * cos1 + a * sin1)
    };
    let y = Tensor::cat(vec![ya, yb], 3).reshape([rows, head]).cast(dtype);
    Ok(y.into_primitive().tensor())
}

/// Checks token rows `[batch · seq, parts · heads · head]` against `layout`.
pub(crate) fn check_rows<B: LowpBackend>(x: &FloatTensor<B>, layout: &HeadLayout) -> Result<()> {
    let dims = x.shape().as_slice().to_vec();
    let want = [layout.batch * layout.seq, layout.parts * layout.heads * layout.head];
    if dims != want || layout.head % 2 != 0 || !(1..=3).contains(&layout.parts) || layout.rope_parts > layout.parts {
        return Err(LowpError::shape(
            "attention rows",
            format!("{dims:?} for {layout:?}"),
            format!("token rows {want:?}: batch · seq rows of parts (1 to 3) · heads · head columns, an even head"),
        ));
    }
    Ok(())
}

/// Checks the parts `[batch · heads, seq, head]` of one dtype against `layout`.
pub(crate) fn check_parts<B: LowpBackend>(parts: &[FloatTensor<B>], layout: &HeadLayout) -> Result<()> {
    let want = [layout.batch * layout.heads, layout.seq, layout.head];
    let dtype = parts.first().map(|p| p.dtype());
    let bad = parts.iter().find(|p| p.shape().as_slice() != want || Some(p.dtype()) != dtype);
    if parts.len() != layout.parts || bad.is_some() || layout.head % 2 != 0 || layout.rope_parts > layout.parts {
        return Err(LowpError::shape(
            "attention heads",
            format!(
                "{:?} for {layout:?}",
                parts.iter().map(|p| (p.shape().as_slice().to_vec(), p.dtype())).collect::<Vec<_>>()
            ),
            format!("{} parts {want:?} of one dtype", layout.parts),
        ));
    }
    Ok(())
}

/// The reference of `AttentionOps::attention_split_heads` with Burn ops (the default): the rows as
/// `[batch, parts · heads, seq, head]`, each part narrowed out and copied, the first
/// `rope_parts` through `attention_rope`.
pub fn split_heads_reference<B: LowpBackend>(
    x: FloatTensor<B>,
    freq: Option<FloatTensor<B>>,
    layout: HeadLayout,
) -> Result<Vec<FloatTensor<B>>> {
    check_rows::<B>(&x, &layout)?;
    let HeadLayout { batch, seq, heads, head, parts, rope_parts } = layout;
    let t = float::<B, 2>(x).reshape([batch, seq, parts * heads, head]).swap_dims(1, 2);
    (0..parts)
        .map(|p| {
            let part = t.clone().narrow(1, p * heads, heads).reshape([batch * heads * seq, head]);
            let part = part.into_primitive().tensor();
            let part = match (&freq, p < rope_parts) {
                (Some(freq), true) => B::attention_rope(part, freq.clone(), RopePositions { seq, start: 0 }, false)?,
                (None, true) => return Err(missing_freq(&layout)),
                (_, false) => part,
            };
            Ok(B::float_reshape(part, Shape::new([batch * heads, seq, head])))
        })
        .collect()
}

/// The reference of `AttentionOps::attention_merge_heads` with Burn ops (the default): each part
/// (the first `rope_parts` through `attention_rope`'s inverse) as `[batch, heads, seq, head]`,
/// concatenated, swapped back and reshaped to token rows.
pub fn merge_heads_reference<B: LowpBackend>(
    parts: Vec<FloatTensor<B>>,
    freq: Option<FloatTensor<B>>,
    layout: HeadLayout,
) -> Result<FloatTensor<B>> {
    check_parts::<B>(&parts, &layout)?;
    let HeadLayout { batch, seq, heads, head, parts: count, rope_parts } = layout;
    let parts = parts
        .into_iter()
        .enumerate()
        .map(|(p, part)| {
            let rows = B::float_reshape(part, Shape::new([batch * heads * seq, head]));
            let rows = match (&freq, p < rope_parts) {
                (Some(freq), true) => B::attention_rope(rows, freq.clone(), RopePositions { seq, start: 0 }, true)?,
                (None, true) => return Err(missing_freq(&layout)),
                (_, false) => rows,
            };
            Ok(float::<B, 2>(rows).reshape([batch, heads, seq, head]))
        })
        .collect::<Result<Vec<_>>>()?;
    let t = Tensor::cat(parts, 1).swap_dims(1, 2).reshape([batch * seq, count * heads * head]);
    Ok(t.into_primitive().tensor())
}

fn missing_freq(layout: &HeadLayout) -> LowpError {
    LowpError::invalid(
        "attention heads",
        format!("{layout:?} without frequencies"),
        "rotated parts need RoPE's frequency table",
    )
}

/// Checks scores `x [rows, seq]` (whole `[seq, seq]` blocks); `(rows, seq)`.
pub(crate) fn check_scores<B: LowpBackend>(x: &FloatTensor<B>) -> Result<(usize, usize)> {
    let dims = x.shape().as_slice().to_vec();
    match dims.as_slice() {
        [rows, seq] if *seq > 0 && rows % seq == 0 => Ok((*rows, *seq)),
        _ => Err(LowpError::shape(
            "attention scores",
            format!("{dims:?}"),
            "causal softmax takes [rows, seq] scores made of whole [seq, seq] blocks of query rows",
        )),
    }
}

/// `[seq, seq]` true where a query (row) must not see a key (column): the key comes later.
fn future_keys<B: LowpBackend>(seq: usize, device: &B::Device) -> Tensor<B, 2, Bool> {
    let positions = Tensor::<B, 1, Int>::arange(0..seq as i64, device);
    let queries = positions.clone().reshape([seq, 1]).expand([seq, seq]);
    let keys = positions.reshape([1, seq]).expand([seq, seq]);
    queries.lower(keys)
}

/// The reference of `AttentionOps::attention_causal_softmax` with Burn ops in f32 (the default for
/// backends without the kernel), rounded to x's dtype once.
pub fn causal_softmax_reference<B: LowpBackend>(x: FloatTensor<B>, scale: f32) -> Result<FloatTensor<B>> {
    let (rows, seq) = check_scores::<B>(&x)?;
    let x = float::<B, 2>(x);
    let (dtype, device) = (x.dtype(), x.device());
    let s = x.cast(FloatDType::F32).mul_scalar(scale).reshape([rows / seq, seq, seq]);
    let mask = future_keys::<B>(seq, &device).unsqueeze::<3>().expand([rows / seq, seq, seq]);
    let s = s.mask_fill(mask, f32::NEG_INFINITY);
    let e = (s.clone() - s.max_dim(2)).exp();
    let p = e.clone() / e.sum_dim(2);
    Ok(p.reshape([rows, seq]).cast(dtype).into_primitive().tensor())
}

/// The reference of `AttentionOps::attention_causal_softmax_backward`: `scale · p · (dp - Σ p ·
/// dp)` per row, in f32, rounded to p's dtype once.
pub fn causal_softmax_backward_reference<B: LowpBackend>(
    p: FloatTensor<B>,
    dp: FloatTensor<B>,
    scale: f32,
) -> Result<FloatTensor<B>> {
    check_scores::<B>(&p)?;
    let (p, dp) = (float::<B, 2>(p), float::<B, 2>(dp));
    let dtype = p.dtype();
    let (p, dp) = (p.cast(FloatDType::F32), dp.cast(FloatDType::F32));
    let dot = (p.clone() * dp.clone()).sum_dim(1);
    let dx = (p * (dp - dot)).mul_scalar(scale);
    Ok(dx.cast(dtype).into_primitive().tensor())
}
