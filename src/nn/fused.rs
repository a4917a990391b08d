//! Fused, differentiable stand-ins for elementwise blocks a Burn model builds from tensor ops:
//! one kernel forward and one backward each on CubeCL backends (`ops/norm_op.rs`,
//! `ops/activation_op.rs`), the same Burn-op arithmetic in f32 elsewhere. Every kernel launch
//! costs host time, and a small model's training step is bound by it (MEASUREMENTS.md, "What
//! bounds the step"), so these keep Burn's modules and parameters and only replace how they run:
//!
//! ```text
//! let h = burn_lowp::nn::fused::rms_norm(&self.norm, x)?; // instead of self.norm.forward(x)
//! let a = burn_lowp::nn::fused::swiglu(h)?; // silu(h[:, :F]) * h[:, F:]
//! let o = burn_lowp::nn::fused::causal_attention(q, k, v, None)?; // attention(.., is_causal)
//! let y = burn_lowp::nn::fused::matmul(x, w, Transposes::default())?; // x.matmul(w)
//! ```

use burn::nn::{Embedding, RmsNorm, RotaryEncoding};
use burn::tensor::{IndexingUpdateOp, Int, Tensor, TensorCreationOptions, TensorPrimitive};

use crate::backend::NormSpec;
use crate::error::{LowpError, Result};
pub use crate::ops::batched_matmul::Transposes;
use crate::ops::{
    Activation, ActivationParams, ActivationSpec, BatchedMatmulOp, CausalSoftmaxOp, LowpLinear,
    RopeOp, RopePositions,
};

/// `norm.forward(x)` for Burn's `RmsNorm` on `x [rows, d_model]`: `x / rms(x) · γ`, the mean of
/// squares and the product with γ in f32, rounded once to x's dtype (Burn's op rounds `rms` to
/// x's dtype before dividing, so BF16 results can differ from it in the last bit).
pub fn rms_norm<B: LowpLinear>(norm: &RmsNorm<B>, x: Tensor<B, 2>) -> Result<Tensor<B, 2>> {
    let spec = NormSpec {
        rms: true,
        eps: norm.epsilon,
        zero_centered_gamma: false,
    };
    let y = B::lowp_norm_rows(
        x.into_primitive().tensor(),
        norm.gamma.val().into_primitive().tensor(),
        &spec,
    )?;
    Ok(Tensor::from_primitive(TensorPrimitive::Float(y)))
}

/// An activation of TE's set on `h [rows, cols]` (gated ones write `[rows, cols / 2]`).
pub fn activation<B: LowpLinear>(h: Tensor<B, 2>, spec: &ActivationSpec) -> Result<Tensor<B, 2>> {
    let y = B::lowp_activation_rows(h.into_primitive().tensor(), spec)?;
    Ok(Tensor::from_primitive(TensorPrimitive::Float(y)))
}

/// SwiGLU: `silu(h[:, :F]) · h[:, F:]` for `h [rows, 2F]`.
pub fn swiglu<B: LowpLinear>(h: Tensor<B, 2>) -> Result<Tensor<B, 2>> {
    activation(
        h,
        &ActivationSpec {
            activation: Activation::Swiglu,
            params: ActivationParams::default(),
        },
    )
}

/// `rope.forward(x)` for Burn's `RotaryEncoding` on `x [batch, heads, seq, head]` (positions
/// from the start of its frequency table, as `forward`): each pair of elements rotated in one
/// kernel forward and one backward. The products and their difference are f32, rounded once to
/// x's dtype (Burn rounds each product to x's dtype first).
pub fn rope<B: LowpLinear>(rope: &RotaryEncoding<B>, x: Tensor<B, 4>) -> Result<Tensor<B, 4>> {
    let [batch, heads, seq, head] = x.dims();
    let y = B::lowp_differentiable(
        [x.reshape([batch * heads * seq, head]).into_primitive().tensor()],
        RopeOp {
            freq: B::to_quant(rope.freq_complex.clone().into_primitive().tensor()),
            positions: RopePositions { seq, start: 0 },
        },
    )?;
    let y: Tensor<B, 2> = Tensor::from_primitive(TensorPrimitive::Float(y));
    Ok(y.reshape([batch, heads, seq, head]))
}

/// `op(a) · op(b)` for `a`, `b` `[batch, rows, cols]` of one float dtype, `t` saying which enter
/// transposed (`a` stored `[batch, k, m]` for `aᵀ`, `b` stored `[batch, n, k]` for `bᵀ`): one
/// cuBLASLt strided batch each way on CUDA (`ops/batched_matmul.rs`), Burn's matmul elsewhere.
pub fn batched_matmul<B: LowpLinear>(
    a: Tensor<B, 3>,
    b: Tensor<B, 3>,
    t: Transposes,
) -> Result<Tensor<B, 3>> {
    let c = B::lowp_differentiable(
        [a.into_primitive().tensor(), b.into_primitive().tensor()],
        BatchedMatmulOp { transposes: t },
    )?;
    Ok(Tensor::from_primitive(TensorPrimitive::Float(c)))
}

/// `op(a) · op(b)` for matrices `a`, `b` (see `batched_matmul`).
pub fn matmul<B: LowpLinear>(a: Tensor<B, 2>, b: Tensor<B, 2>, t: Transposes) -> Result<Tensor<B, 2>> {
    let c = batched_matmul(a.unsqueeze::<3>(), b.unsqueeze::<3>(), t)?;
    let [_, m, n] = c.dims();
    Ok(c.reshape([m, n]))
}

/// `embedding.forward(tokens)` for `tokens [batch, seq]` as `one_hot(tokens) · W`, for small
/// vocabularies. Burn's gather is a cheap forward, but its backward scatters the gradient with
/// `select_assign`, which on CUDA ran 4 thread blocks for 1.5 ms per call in the MoE example
/// (8192 tokens of width 1024 into a 256-row table); here backward is one GEMM
/// `one_hotᵀ · dY` with f32 accumulation. The forward is exact (one non-zero term per output).
/// The one-hot rows are a scatter of ones into zeros (kernels only: an `arange` would upload
/// host data, a blocking round trip to CubeCL's device thread). The product costs `vocab`
/// multiply-adds per output element, so it suits vocabularies of up to a few thousand.
pub fn one_hot_embedding<B: LowpLinear>(
    embedding: &Embedding<B>,
    tokens: Tensor<B, 2, Int>,
) -> Result<Tensor<B, 3>> {
    let [batch, seq] = tokens.dims();
    let w = embedding.weight.val();
    let [vocab, hidden] = w.dims();
    let n = batch * seq;
    let options = TensorCreationOptions::new(w.device()).with_dtype(w.dtype());
    let one_hot = Tensor::<B, 2>::zeros([n, vocab], options.clone()).scatter(
        1,
        tokens.reshape([n, 1]),
        Tensor::<B, 2>::ones([n, 1], options),
        IndexingUpdateOp::Add,
    );
    Ok(matmul(one_hot, w, Transposes::default())?.reshape([batch, seq, hidden]))
}

/// Causal self-attention of a fused QKV projection's rows `qkv [batch · seq, 3 · hidden]`
/// (columns q, k, v, each `heads` heads of `hidden / heads`) with `rope` on q and k, scale
/// `1/sqrt(head)`: the output rows `[batch · seq, hidden]`. The same numbers as splitting the
/// heads with Burn's reshape, swap and narrow, `rope` on q and k, `causal_attention` and merging
/// the heads back (tested to equal it), in one differentiable op whose head split and merge are
/// one kernel each way: Burn's version copies q, k, v and the output forward and, in backward,
/// fills, assigns and adds three QKV-sized gradients (`ops/attention_op.rs`).
pub fn causal_self_attention<B: LowpLinear>(
    qkv: Tensor<B, 2>,
    rope: &RotaryEncoding<B>,
    [batch, seq]: [usize; 2],
    heads: usize,
) -> Result<Tensor<B, 2>> {
    let [rows, cols] = qkv.dims();
    if heads == 0 || cols % (3 * heads) != 0 || rows != batch * seq {
        return Err(LowpError::shape(
            "self-attention qkv",
            format!("[{rows}, {cols}] for batch {batch}, seq {seq}, {heads} heads"),
            "[batch · seq, 3 · heads · head] rows",
        ));
    }
    let head = cols / (3 * heads);
    let layout = crate::ops::attention_op::qkv_layout(batch, seq, heads, head);
    let y = B::lowp_causal_self_attention(
        qkv.into_primitive().tensor(),
        rope.freq_complex.clone().into_primitive().tensor(),
        layout,
        (1.0 / (head as f64).sqrt()) as f32,
    )?;
    Ok(Tensor::from_primitive(TensorPrimitive::Float(y)))
}

/// Causal self-attention of `q, k, v [batch, heads, seq, head]` as Burn's
/// `module::attention(q, k, v, None, None, AttentionModuleOptions { is_causal: true, .. })`
/// computes it for training (Autodiff runs Burn's decomposed fallback): `softmax(scale · q·kᵀ)
/// masked to the keys at or before each query, times v`, with `scale` defaulting to
/// `1/sqrt(head)`. The two products are `batched_matmul`s; the scale, mask and softmax are one kernel
/// forward and one backward (`ops/softmax_op.rs`) instead of about fifteen launches forward and
/// their gradients backward. The softmax is f32, rounded to the scores' dtype once.
pub fn causal_attention<B: LowpLinear>(
    q: Tensor<B, 4>,
    k: Tensor<B, 4>,
    v: Tensor<B, 4>,
    scale: Option<f64>,
) -> Result<Tensor<B, 4>> {
    let [batch, heads, seq, head] = q.dims();
    if k.dims() != q.dims() || v.dims()[..3] != q.dims()[..3] {
        return Err(LowpError::shape(
            "causal attention",
            format!("q {:?}, k {:?}, v {:?}", q.dims(), k.dims(), v.dims()),
            "self-attention takes q and k of one shape [batch, heads, seq, head] and v [batch, heads, seq, head_v]",
        ));
    }
    let scale = scale.unwrap_or(1.0 / (head as f64).sqrt()) as f32;
    let head_v = v.dims()[3];
    let per_head = |t: Tensor<B, 4>, cols| t.reshape([batch * heads, seq, cols]);
    let scores = batched_matmul(
        per_head(q, head),
        per_head(k, head),
        Transposes { a: false, b: true },
    )?
    .reshape([batch * heads * seq, seq]);
    let p = B::lowp_differentiable([scores.into_primitive().tensor()], CausalSoftmaxOp { scale })?;
    let p: Tensor<B, 2> = Tensor::from_primitive(TensorPrimitive::Float(p));
    let o = batched_matmul(
        p.reshape([batch * heads, seq, seq]),
        per_head(v, head_v),
        Transposes::default(),
    )?;
    Ok(o.reshape([batch, heads, seq, head_v]))
}
