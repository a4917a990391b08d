//! The fused training pieces on every backend: the AdamW step (`OptimOps::optim_adamw_step`,
//! one kernel on CubeCL backends) against its Burn-op twin, `FusedAdamW` against Burn's `AdamW`
//! with `GradientClipping::Norm` over a few training steps, and the fused RMSNorm / SwiGLU ops
//! (`nn::fused`) with their gradients against the same blocks written in Burn tensor ops, the
//! fused RoPE against Burn's `RotaryEncoding`, the fused causal attention against Burn's
//! `module::attention`, the batched matmul (cuBLASLt on CUDA) against a host product, and the
//! one-hot embedding against Burn's embedding.
//!
//! Tolerances: on NdArray the default bodies are Burn's own ops, so those comparisons are exact.
//! The kernels compute the same f32 operations in the same order, but GPU compilers may contract
//! a product and a sum into one fused multiply-add (one rounding instead of two), so on wgpu and
//! CUDA f32 results may differ in the last bits; 16-bit parameters may then round to the
//! neighbouring value.
#![allow(dead_code)]

use burn::backend::Autodiff;
use burn::grad_clipping::GradientClippingConfig;
use burn::module::Param;
use burn::nn::RmsNormConfig;
use burn::optim::{AdamWConfig, GradientsParams, Optimizer};
use burn::tensor::activation::silu;
use burn::tensor::ops::FloatTensor;
use burn::tensor::{Tensor, TensorData};
use burn_lowp::backend::LowpBackend;
use burn_lowp::format::{HostMatrix, InputDtype};
use burn_lowp::nn::fused;
use burn_lowp::optim::adamw::adamw_step_reference;
use burn_lowp::optim::{AdamWStep, FusedAdamWConfig};

use crate::common::{read_f32, SplitMix};

pub(crate) fn values(n: usize, seed: u64, std: f64, dtype: InputDtype) -> Vec<f32> {
    let mut rng = SplitMix(seed);
    (0..n).map(|_| dtype.round((std * rng.normal()) as f32)).collect()
}

fn vector<B: LowpBackend>(values: Vec<f32>, dtype: InputDtype, device: &B::Device) -> FloatTensor<B> {
    let m = HostMatrix::new("param", 1, values.len(), dtype, values).unwrap();
    let t = B::bytes_float_from_host(&m, device);
    B::float_reshape(t, burn::tensor::Shape::new([m.cols]))
}

/// `|got - want| <= rel · |want| + abs` everywhere.
pub(crate) fn assert_close(got: &[f32], want: &[f32], rel: f32, abs: f32, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let err = (g - w).abs();
        assert!(
            err <= rel * w.abs() + abs,
            "{what}[{i}]: {g} vs {w} (err {err:.3e})"
        );
    }
}

/// Relative size of one unit in the last place of `dtype`.
fn ulp(dtype: InputDtype) -> f32 {
    match dtype {
        InputDtype::F32 => 2f32.powi(-23),
        InputDtype::F16 => 2f32.powi(-10),
        InputDtype::BF16 => 2f32.powi(-7),
    }
}

/// Two AdamW steps (the first creates the moments), with and without clipping, on an element
/// count that is not a multiple of the kernel's cube: kernel against the Burn-op twin.
pub fn check_adamw_step<B: LowpBackend>(device: &B::Device, dtype: InputDtype, exact: bool) {
    let n = 1030;
    // Clip to 0.05 with gradients of norm ~3.2: the clipping coefficient is active.
    for clip in [None, Some(0.05f32)] {
        let step = AdamWStep {
            lr: 1e-2,
            beta_1: 0.9,
            beta_2: 0.95,
            epsilon: 1e-8,
            weight_decay: 0.1,
            time: 1,
            grad_clip_norm: clip,
        };
        let param = vector::<B>(values(n, 1, 1.0, dtype), dtype, device);
        let grads = [
            vector::<B>(values(n, 2, 0.1, dtype), dtype, device),
            vector::<B>(values(n, 3, 0.1, dtype), dtype, device),
        ];
        let mut state = (param, None);
        for (t, grad) in grads.into_iter().enumerate() {
            let step = AdamWStep { time: t + 1, ..step };
            let (param, moments) = state;
            let got = B::optim_adamw_step(param.clone(), grad.clone(), moments.clone(), &step);
            let want = adamw_step_reference::<B>(param, grad, moments, &step);
            let what = format!("{} clip {clip:?} step {}", dtype.name(), t + 1);
            let (g, w) = (read_f32::<B>(got.param.clone()), read_f32::<B>(want.param.clone()));
            if exact {
                assert_eq!(g, w, "{what}: parameter");
            } else {
                // A few f32 ulps of the update, then the parameter's own rounding.
                assert_close(&g, &w, ulp(dtype), 1e-6, &format!("{what}: parameter"));
            }
            for (name, a, b) in [
                ("m", got.moment_1.clone(), want.moment_1.clone()),
                ("v", got.moment_2.clone(), want.moment_2.clone()),
            ] {
                let (a, b) = (read_f32::<B>(a), read_f32::<B>(b));
                if exact {
                    assert_eq!(a, b, "{what}: {name}");
                } else {
                    // A contracted multiply-add rounds `β·m + (1 - β)·g` once instead of twice;
                    // where the terms cancel (m's sign flips) that error is an ulp of the terms,
                    // not of their difference: bound it by ulps of the largest moment.
                    let scale = b.iter().fold(0.0f32, |m, x| m.max(x.abs()));
                    let u = 4.0 * ulp(InputDtype::F32);
                    assert_close(&a, &b, u, u * scale, &format!("{what}: {name}"));
                }
            }
            state = (want.param, Some((want.moment_1, want.moment_2)));
        }
    }
}

/// Three training steps of a small `Linear` under `FusedAdamW` and under Burn's `AdamW` with
/// `GradientClipping::Norm`, from the same weights and data: the same weights after each step.
pub fn check_fused_adamw_against_burn<B: LowpBackend>(device: &B::Device, exact: bool) {
    type A<B> = Autodiff<B>;
    // Explicit weights: Burn initializes parameters lazily, and clones of an uninitialized
    // module would each draw their own.
    let model = burn::nn::Linear::<A<B>> {
        weight: Param::from_tensor(Tensor::from_data(
            TensorData::new(values(16 * 8, 7, 0.3, InputDtype::F32), [16, 8]),
            device,
        )),
        bias: Some(Param::from_tensor(Tensor::from_data(
            TensorData::new(values(8, 8, 0.3, InputDtype::F32), [8]),
            device,
        ))),
    };
    let mut burn_model = model.clone();
    let mut fused_model = model;
    let mut burn_optim = AdamWConfig::new()
        .with_beta_2(0.95)
        .with_weight_decay(0.1)
        .with_grad_clipping(Some(GradientClippingConfig::Norm(0.5)))
        .init::<A<B>, burn::nn::Linear<A<B>>>();
    let mut fused_optim = FusedAdamWConfig::new()
        .with_beta_2(0.95)
        .with_weight_decay(0.1)
        .with_grad_clip_norm(Some(0.5))
        .init::<A<B>, burn::nn::Linear<A<B>>>();
    for step in 0..3u64 {
        let x = Tensor::<A<B>, 2>::from_data(
            TensorData::new(values(4 * 16, 10 + step, 1.0, InputDtype::F32), [4, 16]),
            device,
        );
        let loss = |m: &burn::nn::Linear<A<B>>| m.forward(x.clone()).powi_scalar(2).mean();
        let g = GradientsParams::from_grads(loss(&burn_model).backward(), &burn_model);
        burn_model = burn_optim.step(1e-2, burn_model, g);
        let g = GradientsParams::from_grads(loss(&fused_model).backward(), &fused_model);
        fused_model = fused_optim.step(1e-2, fused_model, g);
        let read = |m: &burn::nn::Linear<A<B>>| {
            let mut v = m.weight.val().into_data().convert::<f32>().into_vec::<f32>().unwrap();
            v.extend(m.bias.as_ref().unwrap().val().into_data().convert::<f32>().into_vec::<f32>().unwrap());
            v
        };
        let (want, got) = (read(&burn_model), read(&fused_model));
        if exact {
            assert_eq!(got, want, "step {step}: weights");
        } else {
            assert_close(&got, &want, 1e-5, 1e-6, &format!("step {step}: weights"));
        }
    }
}

/// `nn::fused::rms_norm` and `swiglu` on `Autodiff<B>`: values and gradients (x, γ; h) against
/// the blocks in Burn tensor ops, in f32.
pub fn check_norm_and_swiglu<B: LowpBackend>(device: &B::Device) {
    type A<B> = Autodiff<B>;
    let f32s = InputDtype::F32;
    let (rows, cols) = (6, 64);
    let tensor = |seed: u64, std: f64, shape: [usize; 2]| {
        Tensor::<A<B>, 2>::from_data(
            TensorData::new(values(shape[0] * shape[1], seed, std, f32s), shape),
            device,
        )
    };
    let read = |t: Tensor<B, 2>| t.into_data().convert::<f32>().into_vec::<f32>().unwrap();

    // RMSNorm: gamma around 1, loss = Σ y · w.
    let mut norm = RmsNormConfig::new(cols).with_epsilon(1e-5).init::<A<B>>(device);
    let gamma = Tensor::<A<B>, 1>::from_data(
        TensorData::new(values(cols, 21, 0.2, f32s).iter().map(|v| v + 1.0).collect::<Vec<_>>(), [cols]),
        device,
    );
    norm.gamma = Param::from_tensor(gamma);
    let w = tensor(22, 1.0, [rows, cols]);
    let x = tensor(23, 2.0, [rows, cols]).require_grad();
    let y = fused::rms_norm(&norm, x.clone()).unwrap();
    let grads = (y.clone() * w.clone()).sum().backward();
    let (dx, dgamma) = (x.grad(&grads).unwrap(), norm.gamma.val().grad(&grads).unwrap());

    let x_ref = x.clone().detach().require_grad();
    let g_ref = norm.gamma.val().detach().require_grad();
    let rms = (x_ref.clone().square().mean_dim(1) + 1e-5).sqrt();
    let y_ref = x_ref.clone() / rms * g_ref.clone().unsqueeze::<2>();
    let grads_ref = (y_ref.clone() * w.clone()).sum().backward();
    let tol = 1e-5;
    assert_close(&read(y.inner()), &read(y_ref.inner()), tol, tol, "rms_norm y");
    assert_close(&read(dx), &read(x_ref.grad(&grads_ref).unwrap()), tol, tol, "rms_norm dx");
    let dg_ref = g_ref.grad(&grads_ref).unwrap().reshape([1, cols]);
    assert_close(&read(dgamma.reshape([1, cols])), &read(dg_ref), tol, 1e-4, "rms_norm dgamma");

    // SwiGLU: silu(h[:, :F]) · h[:, F:], loss = Σ out · w.
    let f = cols / 2;
    let h = tensor(24, 2.0, [rows, cols]).require_grad();
    let w = tensor(25, 1.0, [rows, f]);
    let out = fused::swiglu(h.clone()).unwrap();
    let grads = (out.clone() * w.clone()).sum().backward();
    let h_ref = h.clone().detach().require_grad();
    let out_ref = silu(h_ref.clone().slice([0..rows, 0..f])) * h_ref.clone().slice([0..rows, f..cols]);
    let grads_ref = (out_ref.clone() * w).sum().backward();
    assert_close(&read(out.inner()), &read(out_ref.inner()), tol, tol, "swiglu y");
    assert_close(
        &read(h.grad(&grads).unwrap()),
        &read(h_ref.grad(&grads_ref).unwrap()),
        tol,
        tol,
        "swiglu dh",
    );
    // Bad input is an error, not a panic: an odd width for a gated activation.
    let odd = tensor(26, 1.0, [rows, 63]);
    assert!(fused::swiglu(odd).is_err());
}

/// `nn::fused::rope` on `Autodiff<B>` against Burn's `RotaryEncoding::forward` (values and the
/// input's gradient) on a `[batch, heads, seq, head]` view of a projection's output (not
/// contiguous, as in attention); the backend op from a later start position and its inverse
/// against the Burn-op reference; mismatched shapes are errors.
pub fn check_rope_against_burn<B: LowpBackend>(device: &B::Device, exact: bool) {
    type A<B> = Autodiff<B>;
    let f32s = InputDtype::F32;
    let (batch, heads, seq, head, max_seq) = (2, 3, 12, 8, 16);
    let rope = burn::nn::RotaryEncodingConfig::new(max_seq, head).init::<A<B>>(device);
    let tensor = |seed: u64, shape: [usize; 4]| {
        let n = shape.iter().product();
        Tensor::<A<B>, 4>::from_data(TensorData::new(values(n, seed, 1.5, f32s), shape), device)
    };
    let read = |t: Tensor<B, 4>| t.into_data().convert::<f32>().into_vec::<f32>().unwrap();
    let x = tensor(31, [batch, seq, heads, head]).require_grad();
    let w = tensor(32, [batch, heads, seq, head]);
    let y = fused::rope(&rope, x.clone().swap_dims(1, 2)).unwrap();
    let grads = (y.clone() * w.clone()).sum().backward();
    let x_ref = x.clone().detach().require_grad();
    let y_ref = rope.forward(x_ref.clone().swap_dims(1, 2));
    let grads_ref = (y_ref.clone() * w).sum().backward();
    let (got, want) = (read(y.inner()), read(y_ref.inner()));
    let (dx, dx_ref) = (read(x.grad(&grads).unwrap()), read(x_ref.grad(&grads_ref).unwrap()));
    if exact {
        assert_eq!(got, want, "rope y equals Burn's bit for bit");
        assert_eq!(dx, dx_ref, "rope dx equals Burn's bit for bit");
    } else {
        // Burn's RoPE multiplies the pairs by its sign matrix with a matmul, which CubeCL runs
        // in TF32 on CUDA (a 10-bit mantissa: 1.3e-5 off on an H100); the fused op's own
        // arithmetic is checked to 1e-6 against the Burn-op reference below.
        assert_close(&got, &want, 2e-3, 2e-3, "rope y");
        assert_close(&dx, &dx_ref, 2e-3, 2e-3, "rope dx");
    }

    // The backend op from position 3, forward and inverse, against the Burn-op reference.
    let positions = burn_lowp::ops::RopePositions { seq: 10, start: 3 };
    let rows = 4 * positions.seq;
    let m = HostMatrix::new("x", rows, head, f32s, values(rows * head, 33, 1.0, f32s)).unwrap();
    let freq = rope.freq_complex.clone().inner().into_primitive().tensor();
    for inverse in [false, true] {
        let x = B::bytes_float_from_host(&m, device);
        let got = B::attention_rope(x.clone(), freq.clone(), positions, inverse).unwrap();
        let want = burn_lowp::ops::rope_op::rope_reference::<B>(x, freq.clone(), positions, inverse).unwrap();
        assert_close(&read_f32::<B>(got), &read_f32::<B>(want), 1e-6, 1e-6, &format!("rope from position 3 (inverse {inverse})"));
    }
    // Bad shapes are errors, not panics: a head the table does not have, positions past its end.
    assert!(fused::rope(&rope, tensor(34, [1, 1, seq, 6])).is_err());
    assert!(fused::rope(&rope, tensor(35, [1, 1, max_seq + 1, head])).is_err());
}

/// `nn::fused::causal_attention` on `Autodiff<B>` against Burn's `module::attention` with
/// `is_causal` (values and the gradients of q, k and v; seq 12 runs the kernels, seq 7 the
/// reference), the backend's causal softmax and its gradient against the Burn-op reference (f32,
/// and on bf16 scores within one bf16 rounding where the suite runs bf16: lavapipe has no bf16
/// casts for the reference), the softmax rows summing to 1 over the keys a
/// query sees and 0 past them, and mismatched shapes as errors.
pub fn check_causal_attention_against_burn<B: LowpBackend>(device: &B::Device, dtypes: &[InputDtype], exact: bool) {
    use burn::tensor::module::attention;
    use burn::tensor::ops::AttentionModuleOptions;
    use burn_lowp::ops::softmax_op::{causal_softmax_backward_reference, causal_softmax_reference};
    type A<B> = Autodiff<B>;
    let f32s = InputDtype::F32;
    let read = |t: Tensor<B, 4>| t.into_data().convert::<f32>().into_vec::<f32>().unwrap();
    for seq in [12, 7] {
        let (batch, heads, head) = (2, 3, 8);
        let tensor = |seed: u64| {
            let shape = [batch, heads, seq, head];
            let n = shape.iter().product();
            Tensor::<A<B>, 4>::from_data(TensorData::new(values(n, seed, 1.0, f32s), shape), device)
        };
        let (q, k, v, w) = (tensor(41).require_grad(), tensor(42).require_grad(), tensor(43).require_grad(), tensor(44));
        let y = fused::causal_attention(q.clone(), k.clone(), v.clone(), None).unwrap();
        let grads = (y.clone() * w.clone()).sum().backward();
        let (qr, kr, vr) = (
            q.clone().detach().require_grad(),
            k.clone().detach().require_grad(),
            v.clone().detach().require_grad(),
        );
        let options = AttentionModuleOptions { scale: None, softcap: None, is_causal: true };
        let y_ref = attention(qr.clone(), kr.clone(), vr.clone(), None, None, options);
        let grads_ref = (y_ref.clone() * w).sum().backward();
        // NdArray: the same f32 formula in a different order (Burn clamps the max and the sum);
        // GPUs: Burn's matmuls run in TF32 on CUDA, as in the RoPE test.
        let (rel, abs) = if exact { (1e-5, 1e-6) } else { (2e-3, 2e-3) };
        let context = format!("seq {seq}");
        assert_close(&read(y.inner()), &read(y_ref.inner()), rel, abs, &format!("{context}: attention output"));
        for (name, (t, r)) in [("dq", (&q, &qr)), ("dk", (&k, &kr)), ("dv", (&v, &vr))] {
            let got = read(t.grad(&grads).unwrap());
            let want = read(r.grad(&grads_ref).unwrap());
            assert_close(&got, &want, rel, abs, &format!("{context}: {name}"));
        }
    }

    // The backend op against the reference, on f32 and bf16 scores: 4 blocks of seq 16 and 2 of
    // seq 168 (rows of whole 16-byte vectors: the vector kernels, the forward's cached variant,
    // several vectors a unit at 168), 1 of seq 1032 (more vectors a row than the cached variant
    // holds: the uncached forward), 3 blocks of seq 4 (f32 vectors, rows not filling the last
    // cube; bf16 pairs).
    let scale = 0.3f32;
    for (seq, rows, &dtype) in [(16, 64), (168, 336), (1032, 1032), (4, 12)]
        .into_iter()
        .flat_map(|(seq, rows)| dtypes.iter().map(move |d| (seq, rows, d)))
    {
        let x = HostMatrix::new("scores", rows, seq, dtype, values(rows * seq, 45, 3.0, dtype)).unwrap();
        let dp = HostMatrix::new("dp", rows, seq, dtype, values(rows * seq, 46, 1.0, dtype)).unwrap();
        let x = B::bytes_float_from_host(&x, device);
        let dp = B::bytes_float_from_host(&dp, device);
        let p = B::attention_causal_softmax(x.clone(), scale).unwrap();
        let p_ref = causal_softmax_reference::<B>(x, scale).unwrap();
        let dx = B::attention_causal_softmax_backward(p.clone(), dp.clone(), scale).unwrap();
        let dx_ref = causal_softmax_backward_reference::<B>(p.clone(), dp, scale).unwrap();
        // f32: the runtime's exp against the host's; bf16: the same result may round to the
        // neighbouring bf16 value.
        let (rel, abs) = match dtype {
            InputDtype::F32 => (1e-5, 1e-7),
            _ => (ulp(dtype), 1e-6),
        };
        let p = read_f32::<B>(p);
        assert_close(&p, &read_f32::<B>(p_ref), rel, abs, &format!("{dtype:?} seq {seq}: causal softmax"));
        assert_close(&read_f32::<B>(dx), &read_f32::<B>(dx_ref), rel, abs, &format!("{dtype:?} seq {seq}: causal softmax backward"));
        for (r, row) in p.chunks_exact(seq).enumerate() {
            let visible = r % seq + 1;
            assert!(row[visible..].iter().all(|&v| v == 0.0), "{dtype:?} row {r}: masked keys get 0");
            let sum: f32 = row[..visible].iter().sum();
            // Each p within half a unit in the last place of the sum's worth: below 2^-8 in bf16.
            let bound = if dtype == InputDtype::F32 { 1e-5 } else { 2f32.powi(-8) };
            assert!((sum - 1.0).abs() <= bound, "{dtype:?} row {r}: sums to {sum}");
        }
    }

    // Bad shapes are errors, not panics: k of another length, scores that are not whole blocks.
    let t = |shape: [usize; 4]| Tensor::<A<B>, 4>::zeros(shape, device);
    assert!(fused::causal_attention(t([1, 2, 8, 4]), t([1, 2, 6, 4]), t([1, 2, 8, 4]), None).is_err());
    let scores = B::bytes_float_from_host(&HostMatrix::new("scores", 10, 4, f32s, vec![0.0; 40]).unwrap(), device);
    assert!(B::attention_causal_softmax(scores, 1.0).is_err());
}

/// `nn::fused::batched_matmul` on `Autodiff<B>` for every pair of transpose flags against the
/// product and its gradients taken on the host in f64 from their definitions (`C = op(A)·op(B)`,
/// loss `Σ C·W`: `d op(A) = W·op(B)ᵀ`, `d op(B) = op(A)ᵀ·W`), f32 operands; on the other `dtypes`,
/// the backend's product of 16-bit operands against its f32 product of the same values within
/// one rounding; `fused::matmul` on matrices; mismatched shapes as errors.
pub fn check_batched_matmul_against_host<B: LowpBackend>(device: &B::Device, dtypes: &[InputDtype], exact: bool) {
    use burn_lowp::ops::batched_matmul::{batched_matmul, Transposes};
    type A<B> = Autodiff<B>;
    let f32s = InputDtype::F32;
    let read = |t: Tensor<B, 3>| t.into_data().convert::<f32>().into_vec::<f32>().unwrap();
    let (batch, m, k, n) = (3, 24, 40, 16);
    // Element (r, c) of the stored [rows, cols] matrix i, read as its transpose when `t`.
    let at = |v: &[f32], i: usize, rows: usize, cols: usize, t: bool, r: usize, c: usize| -> f64 {
        let (r, c) = if t { (c, r) } else { (r, c) };
        v[i * rows * cols + r * cols + c] as f64
    };
    for (ta, tb) in [(false, false), (false, true), (true, false), (true, true)] {
        let a_shape = if ta { [batch, k, m] } else { [batch, m, k] };
        let b_shape = if tb { [batch, n, k] } else { [batch, k, n] };
        let (av, bv, wv) = (
            values(batch * m * k, 51, 1.0, f32s),
            values(batch * k * n, 52, 1.0, f32s),
            values(batch * m * n, 53, 1.0, f32s),
        );
        let tensor = |v: &[f32], shape: [usize; 3]| Tensor::<A<B>, 3>::from_data(TensorData::new(v.to_vec(), shape), device);
        let (a, b, w) = (tensor(&av, a_shape).require_grad(), tensor(&bv, b_shape).require_grad(), tensor(&wv, [batch, m, n]));
        let c = fused::batched_matmul(a.clone(), b.clone(), Transposes { a: ta, b: tb }).unwrap();
        let grads = (c.clone() * w).sum().backward();

        let (mut c_ref, mut da_ref, mut db_ref) = (vec![0f32; batch * m * n], vec![0f32; batch * m * k], vec![0f32; batch * k * n]);
        let (a_dims, b_dims) = ((a_shape[1], a_shape[2]), (b_shape[1], b_shape[2]));
        for i in 0..batch {
            let opa = |r, c| at(&av, i, a_dims.0, a_dims.1, ta, r, c);
            let opb = |r, c| at(&bv, i, b_dims.0, b_dims.1, tb, r, c);
            let wt = |r, c| at(&wv, i, m, n, false, r, c);
            for r in 0..m {
                for c in 0..n {
                    c_ref[i * m * n + r * n + c] = (0..k).map(|p| opa(r, p) * opb(p, c)).sum::<f64>() as f32;
                }
            }
            // d op(A) [m, k] and d op(B) [k, n], stored back in A's and B's own layouts.
            for r in 0..m {
                for p in 0..k {
                    let g = (0..n).map(|c| wt(r, c) * opb(p, c)).sum::<f64>() as f32;
                    let idx = if ta { p * m + r } else { r * k + p };
                    da_ref[i * m * k + idx] = g;
                }
            }
            for p in 0..k {
                for c in 0..n {
                    let g = (0..m).map(|r| opa(r, p) * wt(r, c)).sum::<f64>() as f32;
                    let idx = if tb { c * k + p } else { p * n + c };
                    db_ref[i * k * n + idx] = g;
                }
            }
        }
        // f32 products of 40 (24, 16) terms of unit size against f64: the sums' rounding.
        let (rel, abs) = if exact { (1e-5, 1e-5) } else { (1e-4, 1e-4) };
        let what = format!("transposed a {ta}, b {tb}");
        assert_close(&read(c.inner()), &c_ref, rel, abs, &format!("{what}: product"));
        assert_close(&read(a.grad(&grads).unwrap()), &da_ref, rel, abs, &format!("{what}: da"));
        assert_close(&read(b.grad(&grads).unwrap()), &db_ref, rel, abs, &format!("{what}: db"));
    }

    // 16-bit operands: one rounding of the f32 product of the same (rounded) values.
    for &dtype in dtypes.iter().filter(|&&d| d != f32s) {
        let matrix = |name: &str, seed: u64, rows: usize, cols: usize| {
            let v = values(rows * cols, seed, 1.0, dtype);
            let t = B::bytes_float_from_host(&HostMatrix::new(name, rows, cols, dtype, v.clone()).unwrap(), device);
            let t32 = B::bytes_float_from_host(&HostMatrix::new(name, rows, cols, f32s, v).unwrap(), device);
            let shape = burn::tensor::Shape::new([batch, rows / batch, cols]);
            (B::float_reshape(t, shape.clone()), B::float_reshape(t32, shape))
        };
        let (a, a32) = matrix("a", 54, batch * m, k);
        let (b, b32) = matrix("b", 55, batch * n, k);
        let t = Transposes { a: false, b: true };
        let c = batched_matmul::<B>(a, b, t).unwrap();
        let c32 = batched_matmul::<B>(a32, b32, t).unwrap();
        let got = read(Tensor::from_primitive(burn::tensor::TensorPrimitive::Float(c)));
        let want = read(Tensor::from_primitive(burn::tensor::TensorPrimitive::Float(c32)));
        assert_close(&got, &want, ulp(dtype), 1e-4, &format!("{dtype:?} product"));
    }

    // Matrices, and bad operands as errors (not panics).
    let (xv, yv) = (values(6 * 8, 56, 1.0, f32s), values(8 * 4, 57, 1.0, f32s));
    let x = Tensor::<A<B>, 2>::from_data(TensorData::new(xv.clone(), [6, 8]), device);
    let y = Tensor::<A<B>, 2>::from_data(TensorData::new(yv.clone(), [8, 4]), device);
    let xy_ref: Vec<f32> = (0..6 * 4)
        .map(|e| (0..8).map(|p| xv[e / 4 * 8 + p] as f64 * yv[p * 4 + e % 4] as f64).sum::<f64>() as f32)
        .collect();
    let (rel, abs) = if exact { (1e-5, 1e-5) } else { (1e-4, 1e-4) };
    let xy = fused::matmul(x.clone(), y.clone(), Transposes::default()).unwrap();
    let xy = xy.inner().into_data().convert::<f32>().into_vec::<f32>().unwrap();
    assert_close(&xy, &xy_ref, rel, abs, "matrix product");
    let z = |shape: [usize; 3]| Tensor::<A<B>, 3>::zeros(shape, device);
    assert!(fused::batched_matmul(z([2, 4, 8]), z([2, 6, 4]), Transposes::default()).is_err(), "inner dims differ");
    assert!(fused::batched_matmul(z([2, 4, 8]), z([3, 8, 4]), Transposes::default()).is_err(), "batches differ");
    assert!(fused::matmul(x, y, Transposes { a: false, b: true }).is_err(), "transposed inner dims differ");
}

/// `nn::fused::one_hot_embedding` on `Autodiff<B>` against Burn's `Embedding::forward`: the rows
/// (exact: one non-zero term each) and the table's gradient (summed in another order).
pub fn check_one_hot_embedding_against_burn<B: LowpBackend>(device: &B::Device, exact: bool) {
    use burn::nn::EmbeddingConfig;
    use burn::tensor::Int;
    type A<B> = Autodiff<B>;
    let (vocab, hidden, batch, seq) = (37, 16, 3, 11);
    let embedding = EmbeddingConfig::new(vocab, hidden).init::<A<B>>(device);
    let mut rng = SplitMix(58);
    let ids: Vec<i64> = (0..batch * seq).map(|_| (rng.next_u64() % vocab as u64) as i64).collect();
    let tokens = Tensor::<A<B>, 2, Int>::from_data(TensorData::new(ids, [batch, seq]), device);
    let w = Tensor::<A<B>, 3>::from_data(
        TensorData::new(values(batch * seq * hidden, 59, 1.0, InputDtype::F32), [batch, seq, hidden]),
        device,
    );
    let y = fused::one_hot_embedding(&embedding, tokens.clone()).unwrap();
    let grads = (y.clone() * w.clone()).sum().backward();
    let y_ref = embedding.forward(tokens);
    let grads_ref = (y_ref.clone() * w).sum().backward();
    let read3 = |t: Tensor<B, 3>| t.into_data().convert::<f32>().into_vec::<f32>().unwrap();
    let read2 = |t: Tensor<B, 2>| t.into_data().convert::<f32>().into_vec::<f32>().unwrap();
    assert_eq!(read3(y.inner()), read3(y_ref.inner()), "embedded rows");
    let table = embedding.weight.val();
    let (rel, abs) = if exact { (1e-5, 1e-5) } else { (2e-3, 2e-3) };
    assert_close(
        &read2(table.grad(&grads).unwrap()),
        &read2(table.grad(&grads_ref).unwrap()),
        rel,
        abs,
        "table gradient",
    );
}

/// `nn::fused::causal_self_attention` on `Autodiff<B>` against what it replaces, the MoE model's
/// earlier attention: the QKV rows reshaped, swapped and narrowed into heads, `fused::rope` on q
/// and k, `fused::causal_attention`, and the heads swapped back (values and the QKV gradient). Both
/// run the same products, softmax and RoPE arithmetic
/// (`burn_lowp_kernels::attention::rope::rotate_pair`), so they agree exactly; a signed zero may
/// differ (Burn's narrow gradient adds into +0).
pub fn check_causal_self_attention_against_unfused<B: LowpBackend>(device: &B::Device) {
    type A<B> = Autodiff<B>;
    let f32s = InputDtype::F32;
    let (batch, seq, heads, head, max_seq) = (2, 12, 3, 8, 16);
    let (tokens, hidden) = (batch * seq, heads * head);
    let rope = burn::nn::RotaryEncodingConfig::new(max_seq, head).init::<A<B>>(device);
    let matrix = |seed: u64, shape: [usize; 2]| {
        Tensor::<A<B>, 2>::from_data(TensorData::new(values(shape[0] * shape[1], seed, 1.0, f32s), shape), device)
    };
    let read = |t: Tensor<B, 2>| t.into_data().convert::<f32>().into_vec::<f32>().unwrap();
    let qkv = matrix(51, [tokens, 3 * hidden]).require_grad();
    let w = matrix(52, [tokens, hidden]);
    let y = fused::causal_self_attention(qkv.clone(), &rope, [batch, seq], heads).unwrap();
    let grads = (y.clone() * w.clone()).sum().backward();

    let qkv_ref = qkv.clone().detach().require_grad();
    let t = qkv_ref.clone().reshape([batch, seq, 3 * heads, head]).swap_dims(1, 2);
    let q = fused::rope(&rope, t.clone().narrow(1, 0, heads)).unwrap();
    let k = fused::rope(&rope, t.clone().narrow(1, heads, heads)).unwrap();
    let v = t.narrow(1, 2 * heads, heads);
    let y_ref = fused::causal_attention(q, k, v, None).unwrap().swap_dims(1, 2).reshape([tokens, hidden]);
    let grads_ref = (y_ref.clone() * w).sum().backward();
    assert_eq!(read(y.inner()), read(y_ref.inner()), "self-attention output");
    let (dx, dx_ref) = (read(qkv.grad(&grads).unwrap()), read(qkv_ref.grad(&grads_ref).unwrap()));
    assert_eq!(dx, dx_ref, "self-attention QKV gradient");
    assert!(dx.iter().any(|&g| g != 0.0), "a gradient that is all zero proves nothing");
    // Bad shapes are errors, not panics: rows that are not batch · seq, columns not 3 · heads.
    assert!(fused::causal_self_attention(matrix(53, [tokens + 1, 3 * hidden]), &rope, [batch, seq], heads).is_err());
    assert!(fused::causal_self_attention(matrix(54, [tokens, 3 * hidden]), &rope, [batch, seq], 5).is_err());
    assert!(fused::causal_self_attention(matrix(55, [tokens, 3 * hidden]), &rope, [batch, max_seq + 1], heads).is_err());
}

/// The backend's head split and merge (`AttentionOps::attention_split_heads` / `attention_merge_heads`,
/// one kernel each on CubeCL backends) against their Burn-op references (reshape, swap, narrow,
/// `attention_rope`, cat), bit for bit, for 1 to 3 parts with 0 to 2 rotated and every dtype given;
/// a layout the tensors do not have, and rotated parts without frequencies, are errors.
pub fn check_heads_against_reference<B: LowpBackend>(device: &B::Device, dtypes: &[InputDtype]) {
    use burn_lowp::ops::attention_op::{merge_heads_reference, split_heads_reference, HeadLayout};
    let (batch, seq, heads, max_seq) = (2, 5, 3, 8);
    let bits = |t: FloatTensor<B>| read_f32::<B>(t).into_iter().map(f32::to_bits).collect::<Vec<_>>();
    // Heads of 6 (the pair kernels) and 8 (whole 16-byte vectors in bf16 and f32: the vector kernels).
    for (head, &dtype) in [6, 8].into_iter().flat_map(|head| dtypes.iter().map(move |d| (head, d))) {
        let rope = burn::nn::RotaryEncodingConfig::new(max_seq, head).init::<B>(device);
        let freq = rope.freq_complex.clone().into_primitive().tensor();
        for (parts, rope_parts) in [(3, 2), (1, 0), (2, 1), (3, 0)] {
            let layout = HeadLayout { batch, seq, heads, head, parts, rope_parts };
            let what = format!("{dtype:?} head {head}, {parts} parts, {rope_parts} rotated");
            let cols = parts * heads * head;
            let m = HostMatrix::new("rows", batch * seq, cols, dtype, values(batch * seq * cols, 61, 1.0, dtype)).unwrap();
            let x = B::bytes_float_from_host(&m, device);
            let f = (rope_parts > 0).then(|| freq.clone());
            let got = B::attention_split_heads(x.clone(), f.clone(), layout).unwrap();
            let want = split_heads_reference::<B>(x, f.clone(), layout).unwrap();
            assert_eq!(got.len(), parts, "{what}");
            for (p, (a, b)) in got.iter().zip(&want).enumerate() {
                assert_eq!(burn::tensor::TensorMetadata::shape(a).as_slice(), [batch * heads, seq, head], "{what}: part {p}'s shape");
                assert_eq!(bits(a.clone()), bits(b.clone()), "{what}: split part {p}");
            }
            let merged = B::attention_merge_heads(got, f.clone(), layout).unwrap();
            let merged_ref = merge_heads_reference::<B>(want, f, layout).unwrap();
            assert_eq!(bits(merged), bits(merged_ref), "{what}: merge");
        }
    }
    // Errors, not panics: rows of another width, rotated parts without the table, 4 parts.
    let head = 6;
    let freq = burn::nn::RotaryEncodingConfig::new(max_seq, head).init::<B>(device).freq_complex.into_primitive().tensor();
    let layout = HeadLayout { batch, seq, heads, head, parts: 3, rope_parts: 2 };
    let m = HostMatrix::new("rows", batch * seq, 3 * heads * head + 2, InputDtype::F32, vec![0.5; batch * seq * (3 * heads * head + 2)]).unwrap();
    assert!(B::attention_split_heads(B::bytes_float_from_host(&m, device), Some(freq.clone()), layout).is_err());
    let m = HostMatrix::new("rows", batch * seq, 3 * heads * head, InputDtype::F32, vec![0.5; batch * seq * 3 * heads * head]).unwrap();
    assert!(B::attention_split_heads(B::bytes_float_from_host(&m, device), None, layout).is_err());
    let four = HeadLayout { parts: 4, ..layout };
    assert!(B::attention_split_heads(B::bytes_float_from_host(&m, device), Some(freq), four).is_err());
}

macro_rules! fused_suite {
    ($backend:ty, $device:expr, $dtypes:expr, $exact:expr) => {
        mod fused {
            use super::*;

            #[test]
            fn adamw_step_kernel_matches_its_burn_op_twin() {
                if let Some(d) = $device {
                    for dtype in $dtypes {
                        crate::fused::check_adamw_step::<$backend>(&d, dtype, $exact);
                    }
                }
            }

            #[test]
            fn fused_adamw_trains_as_burn_adamw_with_norm_clipping() {
                if let Some(d) = $device {
                    crate::fused::check_fused_adamw_against_burn::<$backend>(&d, $exact);
                }
            }

            #[test]
            fn fused_rope_matches_burn_rotary_encoding_with_gradients() {
                if let Some(d) = $device {
                    crate::fused::check_rope_against_burn::<$backend>(&d, $exact);
                }
            }

            #[test]
            fn fused_causal_attention_matches_burn_attention_with_gradients() {
                if let Some(d) = $device {
                    crate::fused::check_causal_attention_against_burn::<$backend>(&d, &$dtypes, $exact);
                }
            }

            #[test]
            fn fused_self_attention_equals_split_rope_attention_merge() {
                if let Some(d) = $device {
                    crate::fused::check_causal_self_attention_against_unfused::<$backend>(&d);
                }
            }

            #[test]
            fn head_split_and_merge_match_their_burn_op_twins() {
                if let Some(d) = $device {
                    crate::fused::check_heads_against_reference::<$backend>(&d, &$dtypes);
                }
            }

            #[test]
            fn batched_matmul_matches_host_product_with_gradients() {
                if let Some(d) = $device {
                    crate::fused::check_batched_matmul_against_host::<$backend>(&d, &$dtypes, $exact);
                }
            }

            #[test]
            fn one_hot_embedding_matches_burn_embedding_with_gradients() {
                if let Some(d) = $device {
                    crate::fused::check_one_hot_embedding_against_burn::<$backend>(&d, $exact);
                }
            }

            #[test]
            fn fused_rms_norm_and_swiglu_match_burn_ops_with_gradients() {
                if let Some(d) = $device {
                    crate::fused::check_norm_and_swiglu::<$backend>(&d);
                }
            }
        }
    };
}
pub(crate) use fused_suite;
