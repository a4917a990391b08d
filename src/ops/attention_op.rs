//! Causal self-attention from a fused QKV projection as one differentiable op
//! (`nn::fused::causal_self_attention`): forward one kernel splits the QKV rows into q, k and v
//! heads and rotates q and k (RoPE), then `Q·Kᵀ`, the causal softmax and `P·V`, then one kernel
//! merges the heads back into token rows; backward the same products' gradients, and one kernel
//! writes the QKV gradient with RoPE's gradient applied (`kernels::heads` on CubeCL backends).
//! Built from Burn's reshape, swap and narrow, the same math copies q, k, v and the output
//! forward, and in backward fills, assigns and adds three QKV-sized gradients: on the 1.9B MoE
//! config that was about 9 % of an H100's kernel time per step.

use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::Autodiff;
use burn::tensor::ops::FloatTensor;
use burn::tensor::Shape;

pub use crate::backend::attention::HeadLayout;
use crate::backend::ops::attention::check_rows;
pub use crate::backend::ops::attention::{merge_heads_reference, split_heads_reference};

use super::batched_matmul::{grad_a, grad_b, Transposes};
use crate::backend::LowpBackend;
use crate::error::{LowpError, Result};

/// What backward keeps: the heads (q and k rotated), the softmax output `[batch · heads · seq,
/// seq]`, the frequencies and the shape.
#[derive(Debug, Clone)]
pub struct SelfAttentionSaved<B: LowpBackend> {
    q: FloatTensor<B>,
    k: FloatTensor<B>,
    v: FloatTensor<B>,
    p: FloatTensor<B>,
    freq: FloatTensor<B>,
    layout: HeadLayout,
    scale: f32,
}

/// The layout of QKV rows `[batch · seq, 3 · heads · head]`, q and k rotated.
pub fn qkv_layout(batch: usize, seq: usize, heads: usize, head: usize) -> HeadLayout {
    HeadLayout { batch, seq, heads, head, parts: 3, rope_parts: 2 }
}

/// Causal self-attention of QKV rows `qkv [batch · seq, 3 · heads · head]` (`layout`, from
/// `qkv_layout`) with RoPE on q and k (`freq`, Burn's `freq_complex`) and the softmax scale
/// `scale`: the output rows `[batch · seq, heads · head]` and what backward needs. No autodiff.
pub fn causal_self_attention_rows<B: LowpBackend>(
    qkv: FloatTensor<B>,
    freq: FloatTensor<B>,
    layout: HeadLayout,
    scale: f32,
) -> Result<(FloatTensor<B>, SelfAttentionSaved<B>)> {
    if layout.parts != 3 || layout.rope_parts != 2 {
        return Err(LowpError::invalid(
            "self-attention layout",
            format!("{layout:?}"),
            "QKV rows have 3 parts, q and k rotated (`qkv_layout`)",
        ));
    }
    check_rows::<B>(&qkv, &layout)?;
    let HeadLayout { batch, seq, heads, .. } = layout;
    let [q, k, v]: [FloatTensor<B>; 3] = B::attention_split_heads(qkv, Some(freq.clone()), layout)?
        .try_into()
        .map_err(|_| LowpError::invalid("self-attention", "split", "three parts"))?;
    let scores = B::gemm_batched(q.clone(), k.clone(), Transposes { a: false, b: true })?;
    let scores = B::float_reshape(scores, Shape::new([batch * heads * seq, seq]));
    let p = B::attention_causal_softmax(scores, scale)?;
    let p3 = B::float_reshape(p.clone(), Shape::new([batch * heads, seq, seq]));
    let o = B::gemm_batched(p3, v.clone(), Transposes::default())?;
    let out_layout = HeadLayout { parts: 1, rope_parts: 0, ..layout };
    let out = B::attention_merge_heads(vec![o], None, out_layout)?;
    Ok((out, SelfAttentionSaved { q, k, v, p, freq, layout, scale }))
}

/// The QKV rows' gradient from the output rows' gradient `dy`.
pub fn causal_self_attention_backward<B: LowpBackend>(
    saved: SelfAttentionSaved<B>,
    dy: FloatTensor<B>,
) -> Result<FloatTensor<B>> {
    let SelfAttentionSaved { q, k, v, p, freq, layout, scale } = saved;
    let HeadLayout { batch, seq, heads, .. } = layout;
    let out_layout = HeadLayout { parts: 1, rope_parts: 0, ..layout };
    let [d_o]: [FloatTensor<B>; 1] = B::attention_split_heads(dy, None, out_layout)?
        .try_into()
        .map_err(|_| LowpError::invalid("self-attention", "split", "one part"))?;
    // The gradients of `o = p · v` and `scores = q · kᵀ`, as the batched products' own backward
    // computes them (`batched_matmul::grad_a` / `grad_b`).
    let p3 = B::float_reshape(p.clone(), Shape::new([batch * heads, seq, seq]));
    let plain = Transposes::default();
    let dp = grad_a::<B>(v, d_o.clone(), plain);
    let dv = grad_b::<B>(p3, d_o, plain);
    let dp = B::float_reshape(dp, Shape::new([batch * heads * seq, seq]));
    let ds = B::attention_causal_softmax_backward(p, dp, scale)?;
    let ds = B::float_reshape(ds, Shape::new([batch * heads, seq, seq]));
    let qk = Transposes { a: false, b: true };
    let dq = grad_a::<B>(k, ds.clone(), qk);
    let dk = grad_b::<B>(q, ds, qk);
    B::attention_merge_heads(vec![dq, dk, dv], Some(freq), layout)
}

#[derive(Debug)]
struct SelfAttentionBackward;

impl<B: LowpBackend> Backward<B, 1> for SelfAttentionBackward {
    type State = SelfAttentionSaved<B>;

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let [node] = ops.parents;
        let dy = grads.consume::<B>(&ops.node);
        if let Some(node) = node {
            // Shapes were checked in forward; a failure here is a bug, not user input.
            let dx = causal_self_attention_backward::<B>(ops.state, dy).expect("self-attention backward");
            grads.register::<B>(node.id, dx);
        }
    }
}

/// `causal_self_attention_rows` on `Autodiff<B>`: keeps the heads and the softmax output (as
/// the products it is made of would), not the QKV rows. The frequencies are not differentiated
/// (as in `rope_op`).
pub fn causal_self_attention_autodiff<B: LowpBackend, C: CheckpointStrategy>(
    qkv: FloatTensor<Autodiff<B, C>>,
    freq: FloatTensor<Autodiff<B, C>>,
    layout: HeadLayout,
    scale: f32,
) -> Result<FloatTensor<Autodiff<B, C>>> {
    let (y, saved) = causal_self_attention_rows::<B>(qkv.primitive.clone(), freq.primitive, layout, scale)?;
    Ok(
        match SelfAttentionBackward.prepare::<C>([qkv.node.clone()]).compute_bound().stateful() {
            OpsKind::Tracked(prep) => prep.finish(saved, y),
            OpsKind::UnTracked(prep) => prep.finish(y),
        },
    )
}
