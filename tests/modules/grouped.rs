//! The `GroupedLinear` suite, written once and instantiated per backend by `grouped_suite!`:
//! equal to a loop of `Linear` over the experts under every recipe file, the deferred and fused
//! weight-gradient modes equal the plain path, the weight cache, and bad input.
#![allow(dead_code)]

use burn::backend::Autodiff;
use burn::module::Param;
use burn::optim::GradientsParams;
use burn::tensor::{Distribution, Int, Tensor, TensorData};
use burn_lowp::backend::LowpBackend;
use burn_lowp::nn::{GroupedLinear, GroupedLinearConfig, Linear, LinearConfig};

use crate::suite::{recipe, Exactness, RECIPES};

type AD<B> = Autodiff<B>;

/// The host-sync counters are process-wide: grouped checks (the only split readers) take turns.
static SPLIT_READERS: std::sync::Mutex<()> = std::sync::Mutex::new(());

pub(crate) fn turn() -> std::sync::MutexGuard<'static, ()> {
    SPLIT_READERS.lock().unwrap_or_else(|e| e.into_inner())
}

/// Recipes whose gradient quantizers round stochastically: a grouped call and a loop of calls
/// draw different random streams, so their dX and dW agree only within the format's error.
const STOCHASTIC: [&str; 3] = [
    "nvfp4.json",
    "mxfp8_fwd_nvfp4_bwd.json",
    "nvfp4_keep_first_last_bf16.json",
];

pub(crate) fn values<BB: burn::tensor::backend::Backend, const D: usize>(t: Tensor<BB, D>) -> Vec<f32> {
    t.into_data().convert::<f32>().into_vec::<f32>().unwrap()
}

pub(crate) fn relative_error(got: &[f32], want: &[f32]) -> f64 {
    let err: f64 = got
        .iter()
        .zip(want)
        .map(|(g, w)| (*g as f64 - *w as f64).powi(2))
        .sum();
    let norm: f64 = want.iter().map(|w| (*w as f64).powi(2)).sum();
    if norm == 0.0 {
        err.sqrt()
    } else {
        (err / norm).sqrt()
    }
}

/// Bit for bit on the reference backend; on the GPU the grouped GEMMs run other cuBLASLt
/// algorithms (pointer-array batches, per-group scale folds) than one GEMM per expert, so within
/// 8e-3 relative error (the identity suite's bound: BF16 products summed in another order).
pub(crate) fn same(got: Vec<f32>, want: Vec<f32>, exactness: Exactness, what: &str) -> Option<String> {
    match exactness {
        Exactness::Reference if got != want => {
            let first = got.iter().zip(&want).position(|(g, w)| g != w);
            Some(format!(
                "{what}: differs first at {first:?} (relative error {:.2e})",
                relative_error(&got, &want)
            ))
        }
        Exactness::Gpu if !(relative_error(&got, &want) <= 8e-3) => Some(format!(
            "{what}: relative error {:.2e}",
            relative_error(&got, &want)
        )),
        _ => None,
    }
}

pub fn splits<B: burn::tensor::backend::Backend>(
    splits: &[i64],
    device: &B::Device,
) -> Tensor<B, 1, Int> {
    Tensor::from_data(TensorData::new(splits.to_vec(), [splits.len()]), device)
}

pub(crate) fn grouped<B: LowpBackend>(
    config: &GroupedLinearConfig,
    name: &str,
    device: &B::Device,
) -> GroupedLinear<AD<B>> {
    let mut m: GroupedLinear<AD<B>> = config
        .clone()
        .with_name("layers.1.experts".into())
        .init(&recipe(name), device)
        .unwrap();
    // Non-zero biases, so that db and the bias add are exercised.
    let [e, out, _] = m.weight.dims();
    m.bias = Some(Param::from_tensor(Tensor::random(
        [e, out],
        Distribution::Normal(0.0, 1.0),
        device,
    )));
    m
}

/// `GroupedLinear` equals one `Linear` per expert (same weights, same name, each expert's tokens
/// zero-padded to a multiple of 128 rows as the grouped layout does) under every recipe file:
/// forward, dX, dW and db, bit for bit on the reference backend; under stochastic-rounding
/// recipes dX and dW are checked against exact math within the format's bound instead. Splits
/// include empty experts and an expert holding every token; delayed scaling records each
/// expert's amaxes in its own slots.
pub fn check_grouped_matches_linear_loop<B: LowpBackend>(device: &B::Device, exactness: Exactness) {
    let _turn = turn();
    let (experts, inp, out) = (4, 128, 128);
    let config = GroupedLinearConfig::new(experts, inp, out);
    let mut failures = Vec::new();
    for case in [vec![37i64, 0, 150, 69], vec![0, 0, 200, 0]] {
        let tokens: usize = case.iter().sum::<i64>() as usize;
        for name in RECIPES {
            let m = grouped::<B>(&config, name, device);
            let x = Tensor::<AD<B>, 2>::random([tokens, inp], Distribution::Normal(0.0, 1.0), device);
            let dy = Tensor::<AD<B>, 2>::random([tokens, out], Distribution::Normal(0.0, 1.0), device);
            let xg = Tensor::<AD<B>, 2>::from_inner(x.clone().inner()).require_grad();
            let y = m.forward(xg.clone(), splits::<AD<B>>(&case, device)).unwrap();
            let grads = (y.clone() * dy.clone()).sum().backward();
            let what = |w: &str| format!("{name} splits {case:?}: {w}");
            let mut start = 0;
            let dx = xg.grad(&grads).unwrap();
            let dw = m.weight.grad(&grads).unwrap();
            let db = m.bias.as_ref().unwrap().grad(&grads).unwrap();
            for (g, &n) in case.iter().enumerate() {
                let n = n as usize;
                let dw_g = dw.clone().slice([g..g + 1, 0..out, 0..inp]).reshape([out, inp]);
                let db_g = db.clone().slice([g..g + 1, 0..out]).reshape([out]);
                if n == 0 {
                    for (t, v) in [("dW", values(dw_g)), ("db", values(db_g))] {
                        if v.iter().any(|&v| v != 0.0) {
                            failures.push(what(&format!("expert {g} has no tokens but {t} != 0")));
                        }
                    }
                    continue;
                }
                let linear: Linear<AD<B>> = LinearConfig::new(inp, out)
                    .with_name("layers.1.experts".into())
                    .init(&recipe(name), device)
                    .unwrap();
                let linear = Linear {
                    weight: Param::from_tensor(Tensor::from_inner(m.expert_weight(g).inner())),
                    bias: Some(Param::from_tensor(Tensor::from_inner(
                        m.expert_bias(g).unwrap().inner(),
                    ))),
                    ..linear
                };
                let padded = n.div_ceil(128) * 128;
                let x_g = Tensor::<AD<B>, 2>::from_inner(
                    x.clone().inner().slice([start..start + n, 0..inp]),
                )
                .require_grad();
                let x_pad = Tensor::cat(
                    vec![x_g.clone(), Tensor::zeros([padded - n, inp], device)],
                    0,
                );
                let y_g = linear.forward(x_pad).unwrap().slice([0..n, 0..out]);
                let dy_g = dy.clone().slice([start..start + n, 0..out]);
                let grads_g = (y_g.clone() * dy_g.clone()).sum().backward();
                let e = |w: &str| what(&format!("expert {g} {w}"));
                failures.extend(same(
                    values(y.clone().inner().slice([start..start + n, 0..out])),
                    values(y_g.inner()),
                    exactness,
                    &e("forward"),
                ));
                failures.extend(same(
                    values(db_g),
                    values(linear.bias.as_ref().unwrap().grad(&grads_g).unwrap()),
                    exactness,
                    &e("db"),
                ));
                let dx_g = values(dx.clone().slice([start..start + n, 0..inp]));
                let dw_g = values(dw_g);
                if STOCHASTIC.contains(&name) {
                    let w = m.expert_weight(g).inner();
                    let (xi, dyi) = (x_g.clone().inner(), dy_g.inner());
                    for (t, got, want) in [
                        ("dX", dx_g, values(dyi.clone().matmul(w))),
                        ("dW", dw_g, values(dyi.transpose().matmul(xi))),
                    ] {
                        let r = relative_error(&got, &want);
                        if !(r <= 0.3) {
                            failures.push(e(&format!("{t} relative error {r:.3} > 0.3")));
                        }
                    }
                } else {
                    failures.extend(same(
                        dx_g,
                        values(x_g.grad(&grads_g).unwrap()),
                        exactness,
                        &e("dX"),
                    ));
                    failures.extend(same(
                        dw_g,
                        values(linear.weight.grad(&grads_g).unwrap()),
                        exactness,
                        &e("dW"),
                    ));
                }
                if name == "delayed_scaling.json" {
                    let history = |s: &Option<burn_lowp::quant::DelayedScalingState<AD<B>>>,
                                   cols: &[usize]| {
                        let h = s.as_ref().unwrap().amax_history.value().inner();
                        let [_, w] = h.dims();
                        let row = values(h.slice([0..1, 0..w]));
                        cols.iter().map(|&c| row[c]).collect::<Vec<_>>()
                    };
                    let grouped_amax = [
                        history(&m.lowp.delayed_forward, &[3 * g, 3 * g + 1]),
                        history(&m.lowp.delayed_backward, &[2 * g]),
                    ];
                    let linear_amax = [
                        history(&linear.lowp.delayed_forward, &[0, 1]),
                        history(&linear.lowp.delayed_backward, &[0]),
                    ];
                    if grouped_amax != linear_amax {
                        failures.push(e(&format!(
                            "amaxes {grouped_amax:?} recorded, the expert's Linear {linear_amax:?}"
                        )));
                    }
                }
                start += n;
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// `delay_wgrad_compute` + `backward_dw` and `fuse_wgrad_accumulation` give the plain path's
/// weight gradient (bit for bit on the reference backend): deferred, registered under the
/// weight's id; fused, accumulated over micro-batches into `main_grad` and overwritten by the
/// next first micro-batch, with no weight gradient in the graph.
pub fn check_grouped_wgrad_modes<B: LowpBackend>(device: &B::Device, exactness: Exactness) {
    let _turn = turn();
    let (experts, inp, out) = (3, 128, 128);
    let case = [100i64, 0, 60];
    let tokens = 160;
    let mut failures = Vec::new();
    for name in ["bf16.json", "current_scaling.json", "block_scaling.json"] {
        let plain = grouped::<B>(&GroupedLinearConfig::new(experts, inp, out), name, device);
        let with = |c: GroupedLinearConfig| {
            let mut m = grouped::<B>(&c, name, device);
            m.weight = Param::from_tensor(Tensor::from_inner(plain.weight.val().inner()));
            m.bias = plain.bias.clone();
            m
        };
        // Tracked inputs (an expert layer's input always is): they keep the op in the graph.
        let xs: Vec<Tensor<AD<B>, 2>> = (0..3)
            .map(|_| {
                Tensor::random([tokens, inp], Distribution::Normal(0.0, 1.0), device).require_grad()
            })
            .collect();
        let dy = Tensor::<AD<B>, 2>::random([tokens, out], Distribution::Normal(0.0, 1.0), device);
        let dw_plain = |x: &Tensor<AD<B>, 2>| {
            let y = plain.forward(x.clone(), splits::<AD<B>>(&case, device)).unwrap();
            plain.weight.grad(&(y * dy.clone()).sum().backward()).unwrap()
        };
        let want: Vec<_> = xs.iter().map(dw_plain).collect();

        let deferred = with(
            GroupedLinearConfig::new(experts, inp, out).with_delay_wgrad_compute(true),
        );
        let y = deferred.forward(xs[0].clone(), splits::<AD<B>>(&case, device)).unwrap();
        let grads = (y * dy.clone()).sum().backward();
        if deferred.weight.grad(&grads).is_some() {
            failures.push(format!("{name}: deferred wgrad reached the graph"));
        }
        let mut params = GradientsParams::from_grads(grads, &deferred);
        deferred.backward_dw(&mut params).unwrap();
        match params.get::<B, 3>(deferred.weight.id) {
            Some(dw) => failures.extend(same(
                values(dw),
                values(want[0].clone()),
                exactness,
                &format!("{name}: backward_dw"),
            )),
            None => failures.push(format!("{name}: backward_dw registered no gradient")),
        }

        let fused = with(
            GroupedLinearConfig::new(experts, inp, out).with_fuse_wgrad_accumulation(true),
        );
        for (i, first) in [(0, Some(true)), (1, Some(false))] {
            let y = fused
                .forward_microbatch(xs[i].clone(), splits::<AD<B>>(&case, device), first)
                .unwrap();
            let grads = (y * dy.clone()).sum().backward();
            if fused.weight.grad(&grads).is_some() {
                failures.push(format!("{name}: fused wgrad reached the graph"));
            }
        }
        let sum = want[0].clone() + want[1].clone();
        failures.extend(same(
            values(fused.main_grad().expect("main_grad after backward")),
            values(sum),
            exactness,
            &format!("{name}: main_grad over two micro-batches"),
        ));
        let y = fused
            .forward_microbatch(xs[2].clone(), splits::<AD<B>>(&case, device), Some(true))
            .unwrap();
        let _ = (y * dy.clone()).sum().backward();
        failures.extend(same(
            values(fused.main_grad().unwrap()),
            values(want[2].clone()),
            exactness,
            &format!("{name}: main_grad overwritten by a first micro-batch"),
        ));
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Cached micro-batches reuse the stacked quantized weights: one weight quantization for four
/// micro-batches, identical outputs.
pub fn check_grouped_weight_cache<B: LowpBackend>(device: &B::Device) {
    let _turn = turn();
    for name in ["current_scaling.json", "mxfp8.json"] {
        let m = grouped::<B>(&GroupedLinearConfig::new(2, 128, 128), name, device);
        let case = [70i64, 58];
        let x = Tensor::<AD<B>, 2>::random([128, 128], Distribution::Normal(0.0, 1.0), device);
        let first = m
            .forward_microbatch(x.clone(), splits::<AD<B>>(&case, device), Some(true))
            .unwrap();
        for _ in 0..3 {
            m.forward_microbatch(x.clone(), splits::<AD<B>>(&case, device), Some(false))
                .unwrap();
        }
        assert_eq!(m.weight_quantizations(), 1, "{name}");
        let again = m
            .forward_microbatch(x.clone(), splits::<AD<B>>(&case, device), Some(false))
            .unwrap();
        assert_eq!(values(first.inner()), values(again.inner()), "{name}");
        m.forward(x, splits::<AD<B>>(&case, device)).unwrap();
        assert_eq!(m.weight_quantizations(), 2, "{name}: no cache: quantize");
    }
}

pub(crate) fn message(e: burn_lowp::error::LowpError) -> String {
    e.to_string()
}

/// Bad input is a `LowpError` naming the tensor, the value and the rule, never a panic, and the
/// module works as before afterwards. Splits whose check needs the host report where a GEMM reads
/// them: in `forward` on per-group paths, from the next `forward` (or `take_backward_error`) when
/// only backward read them (the graph-safe path).
pub fn check_grouped_bad_input<B: LowpBackend>(device: &B::Device) {
    let _turn = turn();
    let err = |r: Result<GroupedLinear<AD<B>>, _>| message(r.err().expect("an init error"));
    let e = err(GroupedLinearConfig::new(4, 128, 96).init(&recipe("bf16.json"), device));
    assert!(e.contains("out_features") && e.contains("96"), "{e}");
    let e = err(GroupedLinearConfig::new(0, 128, 128).init(&recipe("bf16.json"), device));
    assert!(e.contains("num_gemms"), "{e}");
    let e = err(GroupedLinearConfig::new(2, 100, 128).init(&recipe("block_scaling.json"), device));
    assert!(e.contains("100"), "{e}");

    for name in ["bf16.json", "current_scaling.json", "block_scaling.json"] {
        let m = grouped::<B>(&GroupedLinearConfig::new(4, 128, 128), name, device);
        let x = Tensor::<AD<B>, 2>::random([64, 128], Distribution::Normal(0.0, 1.0), device);
        let good = [16i64, 16, 0, 32];
        let reference = values(m.forward(x.clone(), splits::<AD<B>>(&good, device)).unwrap().inner());

        let e = message(m.forward(x.clone(), splits::<AD<B>>(&[32, 32, 0], device)).unwrap_err());
        assert!(e.contains("m_splits") && e.contains("[3]"), "{name}: {e}");
        let wide = Tensor::<AD<B>, 2>::zeros([64, 96], device);
        let e = message(m.forward(wide, splits::<AD<B>>(&good, device)).unwrap_err());
        assert!(e.contains("96") && e.contains("in_features"), "{name}: {e}");

        for (bad, words) in [
            (vec![10i64, 10, 10, 10], ["m_splits", "40", "64"]),
            (vec![-5i64, 37, 16, 16], ["m_splits[0]", "-5", "negative"]),
        ] {
            let xr = Tensor::<AD<B>, 2>::from_inner(x.clone().inner()).require_grad();
            let e = match m.forward(xr.clone(), splits::<AD<B>>(&bad, device)) {
                Err(e) => message(e),
                Ok(y) => {
                    let _ = y.sum().backward();
                    message(
                        m.take_backward_error()
                            .unwrap_or_else(|| panic!("{name}: splits {bad:?} were not reported")),
                    )
                }
            };
            for w in words {
                assert!(e.contains(w), "{name}: splits {bad:?}: `{e}` lacks `{w}`");
            }
        }
        // Nothing was lost: the module gives what it gave before.
        let after = values(m.forward(x, splits::<AD<B>>(&good, device)).unwrap().inner());
        assert_eq!(after, reference, "{name}: the module changed after bad input");
    }
}

/// `fp8_scales: shared` (current scaling): every expert's GEMMs run on one scale per operand,
/// that of the operand's amax over all experts. Forward, dX and dW equal, expert by expert, exact
/// products of the operands quantized on the host with those shared scales (relative error per
/// expert <= 1e-2: BF16 outputs and summation order on the GPU). Expert 2's tokens are 2^-16 of
/// the others', so its own scale would give it other codes than the shared one: per-expert
/// scales fail this check by far.
pub fn check_grouped_shared_fp8_scales<B: LowpBackend>(device: &B::Device) {
    use burn_lowp::format::grouped::GroupScaling;
    use burn_lowp::format::{quantize_fp8_with_scale, Direction, Fp8CurrentScaling, Fp8Format, HostMatrix, InputDtype, Usage};
    let _turn = turn();
    let (experts, inp, out) = (4, 128, 128);
    let case = [37i64, 0, 150, 69];
    let tokens = 256;
    let m: GroupedLinear<AD<B>> = GroupedLinearConfig::new(experts, inp, out)
        .with_bias(false)
        .with_fp8_scales(GroupScaling::Shared)
        .with_name("layers.1.experts".into())
        .init(&recipe("current_scaling.json"), device)
        .unwrap();
    let x = Tensor::<AD<B>, 2>::random([tokens, inp], Distribution::Normal(0.0, 1.0), device);
    let expert2 = Tensor::cat(
        vec![
            Tensor::<AD<B>, 1>::ones([37], device),
            Tensor::full([150], 2f32.powi(-16), device),
            Tensor::ones([69], device),
        ],
        0,
    );
    let x = Tensor::<AD<B>, 2>::from_inner((x * expert2.reshape([tokens, 1])).inner()).require_grad();
    let dy = Tensor::<AD<B>, 2>::random([tokens, out], Distribution::Normal(0.0, 1.0), device);
    let y = m.forward(x.clone(), splits::<AD<B>>(&case, device)).unwrap();
    let grads = (y.clone() * dy.clone()).sum().backward();
    let (y, dx, dw) = (
        values(y.inner()),
        values(x.grad(&grads).unwrap()),
        values(m.weight.grad(&grads).unwrap()),
    );
    let (xv, dyv, wv) = (values(x.inner()), values(dy.inner()), values(m.weight.val().inner()));
    // The host reference: each operand's values quantized with its one shared scale.
    let shared = |v: &[f32], rows: usize, cols: usize, fp8: Fp8Format| {
        let amax = v.iter().fold(0.0f32, |a, b| a.max(b.abs()));
        let scale = Fp8CurrentScaling::new(fp8).scale_for(amax);
        let host = HostMatrix::new("operand", rows, cols, InputDtype::F32, v.to_vec()).unwrap();
        quantize_fp8_with_scale(&host, fp8, scale, Usage::ROWWISE).unwrap().dequantize(Direction::Rowwise).unwrap()
    };
    let (qx, qw, qdy) = (
        shared(&xv, tokens, inp, Fp8Format::E4M3),
        shared(&wv, experts * out, inp, Fp8Format::E4M3),
        shared(&dyv, tokens, out, Fp8Format::E5M2),
    );
    // C[i, j] = sum_k A[i, k] B[j, k] for row-major A [n, kk] (rows a0..) and B [m, kk].
    let product = |a: &dyn Fn(usize, usize) -> f32, b: &dyn Fn(usize, usize) -> f32, n: usize, m: usize, kk: usize| {
        let mut c = vec![0.0f32; n * m];
        for i in 0..n {
            for j in 0..m {
                c[i * m + j] = (0..kk).map(|k| a(i, k) as f64 * b(j, k) as f64).sum::<f64>() as f32;
            }
        }
        c
    };
    let mut failures = Vec::new();
    let mut start = 0;
    for (g, &n) in case.iter().enumerate() {
        let n = n as usize;
        let w0 = g * out * inp;
        let rows = |v: &[f32], cols: usize| v[start * cols..(start + n) * cols].to_vec();
        let checks = [
            (
                "forward",
                rows(&y, out),
                product(&|i, k| qx[(start + i) * inp + k], &|j, k| qw[w0 + j * inp + k], n, out, inp),
            ),
            (
                "dX",
                rows(&dx, inp),
                product(&|i, k| qdy[(start + i) * out + k], &|j, k| qw[w0 + k * inp + j], n, inp, out),
            ),
            (
                "dW",
                dw[w0..w0 + out * inp].to_vec(),
                product(&|i, k| qdy[(start + k) * out + i], &|j, k| qx[(start + k) * inp + j], out, inp, n),
            ),
        ];
        for (what, got, want) in checks {
            let r = relative_error(&got, &want);
            if !(r <= 1e-2) {
                failures.push(format!("expert {g} {what}: relative error {r:.3e} against the shared-scale reference"));
            }
        }
        start += n;
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// `forward` hands the op the packed tokens (the FP8 per-tensor cast pads them as it reads, no
/// padded copy) and `forward_aligned` the padded batch: the same output, dX, dW and db bit for
/// bit on every backend, under every recipe without stochastic rounding (those draw new random
/// streams per call).
pub fn check_grouped_packed_input_equals_aligned<B: LowpBackend>(device: &B::Device) {
    use burn::tensor::TensorPrimitive;
    use burn_lowp::ops::{LowpLinear, RowMove};
    let _turn = turn();
    let (experts, inp, out) = (4, 128, 128);
    let config = GroupedLinearConfig::new(experts, inp, out);
    let mut failures = Vec::new();
    let case = vec![37i64, 0, 150, 69];
    let tokens: usize = case.iter().sum::<i64>() as usize;
    fn move_rows<B: LowpBackend>(
        t: Tensor<AD<B>, 2>,
        layout: &burn_lowp::backend::GroupLayout<B>,
        direction: RowMove,
    ) -> Tensor<AD<B>, 2> {
        Tensor::from_primitive(TensorPrimitive::Float(<AD<B> as LowpLinear>::lowp_move_rows(
            t.into_primitive().tensor(),
            layout,
            direction,
        )))
    }
    for name in RECIPES.iter().filter(|n| !STOCHASTIC.contains(n)) {
        let m = grouped::<B>(&config, name, device);
        let x = Tensor::<AD<B>, 2>::random([tokens, inp], Distribution::Normal(0.0, 1.0), device);
        let dy = Tensor::<AD<B>, 2>::random([tokens, out], Distribution::Normal(0.0, 1.0), device);
        let run = |aligned: bool| {
            let xg = Tensor::<AD<B>, 2>::from_inner(x.clone().inner()).require_grad();
            let y = if aligned {
                let layout = m.layout(splits::<AD<B>>(&case, device), tokens).unwrap();
                let xa = move_rows(xg.clone(), &layout, RowMove::Pad);
                let ya = m.forward_aligned(xa, &layout, None).unwrap();
                move_rows(ya, &layout, RowMove::Unpad)
            } else {
                m.forward(xg.clone(), splits::<AD<B>>(&case, device)).unwrap()
            };
            let grads = (y.clone() * dy.clone()).sum().backward();
            let dx = xg.grad(&grads).unwrap();
            let dw = m.weight.grad(&grads).unwrap();
            let db = m.bias.as_ref().unwrap().grad(&grads).unwrap();
            [values(y.inner()), values(dx), values(dw), values(db)]
        };
        let (packed, aligned) = (run(false), run(true));
        for (what, (p, a)) in ["y", "dX", "dW", "db"].iter().zip(packed.into_iter().zip(aligned)) {
            if let Some(f) = same(p, a, crate::suite::Exactness::Reference, &format!("{name}: {what}, packed against aligned")) {
                failures.push(f);
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

macro_rules! grouped_suite {
    ($backend:ty, $device:expr, $exactness:expr) => {
        #[test]
        fn grouped_linear_equals_a_loop_of_linear_under_every_recipe() {
            if let Some(d) = $device {
                crate::grouped::check_grouped_matches_linear_loop::<$backend>(&d, $exactness);
            }
        }

        #[test]
        fn grouped_linear_deferred_and_fused_wgrad_equal_the_plain_path() {
            if let Some(d) = $device {
                crate::grouped::check_grouped_wgrad_modes::<$backend>(&d, $exactness);
            }
        }

        #[test]
        fn grouped_linear_caches_stacked_weights_across_micro_batches() {
            if let Some(d) = $device {
                crate::grouped::check_grouped_weight_cache::<$backend>(&d);
            }
        }

        #[test]
        fn grouped_linear_shared_fp8_scales_equal_the_shared_scale_reference() {
            if let Some(d) = $device {
                crate::grouped::check_grouped_shared_fp8_scales::<$backend>(&d);
            }
        }

        #[test]
        fn grouped_linear_packed_input_equals_aligned() {
            if let Some(d) = $device {
                crate::grouped::check_grouped_packed_input_equals_aligned::<$backend>(&d);
            }
        }

        #[test]
        fn grouped_linear_bad_input_is_an_error() {
            if let Some(d) = $device {
                crate::grouped::check_grouped_bad_input::<$backend>(&d);
            }
        }
    };
}
pub(crate) use grouped_suite;

