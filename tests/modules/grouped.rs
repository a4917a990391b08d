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

fn values<BB: burn::tensor::backend::Backend, const D: usize>(t: Tensor<BB, D>) -> Vec<f32> {
    t.into_data().convert::<f32>().into_vec::<f32>().unwrap()
}

fn relative_error(got: &[f32], want: &[f32]) -> f64 {
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
fn same(got: Vec<f32>, want: Vec<f32>, exactness: Exactness, what: &str) -> Option<String> {
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

fn grouped<B: LowpBackend>(
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

fn message(e: burn_lowp::error::LowpError) -> String {
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

/// Operands for calling the grouped GEMMs directly on a module of 4 experts of 256 -> 256: X
/// over `layout`'s rows and the experts' stacked W (1024 rows) with their groups, both quantized
/// (rowwise and columnwise) by the module's forward slots; element `i` of operand `w` (0 = X,
/// 1 = W) is `value(w, i)`.
fn expert_operands<B: LowpBackend>(
    m: &GroupedLinear<AD<B>>,
    layout: &burn_lowp::backend::GroupLayout<B>,
    scaling: burn_lowp::format::grouped::GroupScaling,
    device: &B::Device,
    value: impl Fn(usize, usize) -> f32,
) -> (
    burn_lowp::quant::QuantizedTensor<B>,
    burn_lowp::quant::QuantizedTensor<B>,
    burn_lowp::backend::Groups<B>,
) {
    use burn_lowp::format::{grouped::uniform_groups, HostMatrix, InputDtype, Usage};
    let matrix = |rows: usize, w: usize| {
        let values = (0..rows * 256).map(|i| value(w, i)).collect();
        B::bytes_float_from_host(&HostMatrix::new("operand", rows, 256, InputDtype::F32, values).unwrap(), device)
    };
    let both = Usage {
        rowwise: true,
        columnwise: true,
    };
    let quantize = |t, groups, slot: usize| {
        let spec = &m.lowp.quantizers.forward[slot].spec;
        burn_lowp::quant::grouped::quantize_grouped::<B>(t, groups, spec, both, 0, None, scaling).unwrap()
    };
    let qx = quantize(matrix(layout.rows(), 0), &layout.groups, 0);
    let weight_groups =
        burn_lowp::backend::Groups::<B>::from_host(uniform_groups(4, 256), 1024, device).unwrap();
    let qw = quantize(matrix(1024, 1), &weight_groups, 1);
    (qx, qw, weight_groups)
}

/// The graph-safe path (CUDA): under BF16 and FP8 per-tensor recipes, fprop and dgrad run as
/// one pointer-array call over device splits (also with shared expert scales), and a forward reads
/// no split on the host; FP8 block scaling and every wgrad run per group on the host copy of the
/// splits.
pub fn check_grouped_device_splits_path<B: LowpBackend>(device: &B::Device) {
    use burn_lowp::backend::{host_syncs, GemmKind, GemmPath, GroupedGemmPath, GroupedOperand};
    let _turn = turn();
    let case = [300i64, 0, 17, 195];
    let tokens = 512;
    use burn_lowp::format::grouped::GroupScaling;
    for (name, scaling, fprop_dgrad) in [
        ("bf16.json", GroupScaling::PerGroup, GroupedGemmPath::PointerArray(GemmPath::CublasLtHighPrecision)),
        ("current_scaling.json", GroupScaling::PerGroup, GroupedGemmPath::PointerArray(GemmPath::CublasLtFp8Tensor)),
        ("current_scaling.json", GroupScaling::Shared, GroupedGemmPath::PointerArray(GemmPath::CublasLtFp8Tensor)),
        ("block_scaling.json", GroupScaling::PerGroup, GroupedGemmPath::PerGroup(GemmPath::CublasLtFp8Block)),
    ] {
        let m = grouped::<B>(&GroupedLinearConfig::new(4, 256, 256).with_fp8_scales(scaling), name, device);
        let x = Tensor::<AD<B>, 2>::random([tokens, 256], Distribution::Normal(0.0, 1.0), device);
        // Warm up (algorithm selection per shape), then count.
        m.forward(x.clone(), splits::<AD<B>>(&case, device)).unwrap();
        let before = host_syncs();
        let y = m.forward(x.clone(), splits::<AD<B>>(&case, device)).unwrap();
        let reads = host_syncs().since(&before).split_reads;
        let _ = values(y.inner());
        if matches!(fprop_dgrad, GroupedGemmPath::PointerArray(_)) {
            assert_eq!(reads, 0, "{name} {scaling:?}: a graph-safe forward read the splits on the host");
        }
        // The paths the backend picks for these operands (in == out, so X stands for dY too).
        let layout = m.layout(splits::<AD<B>>(&case, device), tokens).unwrap();
        let (qx, qw, weight_groups) =
            expert_operands(&m, &layout, scaling, device, |_, i| ((i % 7) as f32 - 3.0) / 4.0);
        let x_op = GroupedOperand {
            tensor: &qx,
            groups: &layout.groups,
        };
        let w_op = GroupedOperand {
            tensor: &qw,
            groups: &weight_groups,
        };
        for kind in [GemmKind::Fprop, GemmKind::Dgrad] {
            assert_eq!(B::grouped_gemm_path(kind, x_op, w_op), fprop_dgrad, "{name} {scaling:?} {kind:?}");
        }
        assert!(
            matches!(
                B::grouped_gemm_path(GemmKind::Wgrad, x_op, x_op),
                GroupedGemmPath::PerGroup(_)
            ),
            "{name}: wgrad runs per group"
        );
    }
}

/// A grouped GEMM's output: a product (not all zeros) in its group rows, the first `cut` values,
/// and zeros in the rows after the last group.
fn check_product_then_zero_rows(out: &[f32], cut: usize, what: &str) {
    assert!(out[..cut].iter().any(|&v| v != 0.0), "{what}: empty product");
    assert!(out[cut..].iter().all(|&v| v == 0.0), "{what}: rows after the last group are not zero");
}

/// The graph-safe path sizes its batch by what the host knows when the GEMM is queued (CUDA):
/// with the splits' host copy arrived it runs exactly the chunks the groups fill and zeroes the
/// rest of the output, without it the host-known bound of chunks; both give the same numbers,
/// bit for bit, on every group row (the same algorithm runs either way), under BF16 and FP8
/// per-tensor operands (per-expert and shared scales), fprop and dgrad.
pub fn check_grouped_exact_batches_equal_bound<B: LowpBackend>(device: &B::Device) {
    use burn::tensor::TensorPrimitive;
    use burn_lowp::backend::{host_syncs, GemmKind, GemmOptions, GroupedOperand, Groups};
    use burn_lowp::format::grouped::GroupScaling;
    let _turn = turn();
    // Aligned groups of 384, 0, 128 and 256 rows: 6 chunks filled of the bound's 8.
    let case = [300i64, 0, 17, 195];
    let tokens = 512;
    for (name, scaling) in [
        ("bf16.json", GroupScaling::PerGroup),
        ("current_scaling.json", GroupScaling::PerGroup),
        ("current_scaling.json", GroupScaling::Shared),
    ] {
        let m = grouped::<B>(&GroupedLinearConfig::new(4, 256, 256).with_fp8_scales(scaling), name, device);
        let layout = m.layout(splits::<AD<B>>(&case, device), tokens).unwrap();
        // Reads the splits (waits for their copy): the layout's groups are known on the host.
        layout.check().unwrap();
        let filled_rows: usize = 768;
        assert_eq!(layout.rows(), 1024, "the bound of the case");
        let (qx, qw, weight_groups) = expert_operands(&m, &layout, scaling, device, |w, i| {
            (((i * 7 + [1, 5][w]) % 13) as f32 - 6.0) / 8.0
        });
        let unknown = Groups::<B> {
            host: layout.groups.host.unresolved(),
            ..layout.groups.clone()
        };
        for kind in [GemmKind::Fprop, GemmKind::Dgrad] {
            let run = |groups: &Groups<B>| {
                let x_op = GroupedOperand { tensor: &qx, groups };
                let w_op = GroupedOperand {
                    tensor: &qw,
                    groups: &weight_groups,
                };
                let before = host_syncs();
                let out = B::grouped_gemm(kind, x_op, w_op, GemmOptions::default()).unwrap();
                let out = values(Tensor::<B, 2>::from_primitive(TensorPrimitive::Float(out)));
                let counts = host_syncs().since(&before);
                (out, counts.exact_batches, counts.bound_batches, counts.split_reads)
            };
            let (exact, exact_runs, bound_runs, reads) = run(&layout.groups);
            assert_eq!((exact_runs, bound_runs, reads), (1, 0, 0), "{name} {scaling:?} {kind:?}: exact batch");
            let (bound, exact_runs, bound_runs, reads) = run(&unknown);
            assert_eq!((exact_runs, bound_runs, reads), (0, 1, 0), "{name} {scaling:?} {kind:?}: bound batch");
            let cols = exact.len() / 1024;
            let cut = filled_rows * cols;
            assert!(
                exact[..cut] == bound[..cut],
                "{name} {scaling:?} {kind:?}: group rows differ between the exact and the bound batch"
            );
            check_product_then_zero_rows(&exact, cut, &format!("{name} {scaling:?} {kind:?}: the exact batch"));
        }
    }
}

/// The pointer array on per-expert FP8 scales may leave its scale pass to the consumer (CUDA):
/// `grouped_gemm_unscaled` then returns the unit-scale product and the operands' per-expert
/// `scale_inv`, and `grouped_epilogue` with those scales gives the scaled GEMM's token rows bit
/// for bit (fprop and dgrad) and zero padding rows; gathered with the layout's unpad map, the
/// token rows in token order. Shared scales and BF16 leave nothing to the consumer.
pub fn check_grouped_deferred_scales_equal_the_scale_pass<B: LowpBackend>(device: &B::Device) {
    use burn::tensor::TensorPrimitive;
    use burn_lowp::backend::{GemmKind, GemmOptions, GroupEpilogue, GroupedOperand};
    use burn_lowp::format::grouped::GroupScaling;
    let _turn = turn();
    let case = [300i64, 0, 17, 195];
    let tokens = 512;
    for (name, scaling, deferred) in [
        ("current_scaling.json", GroupScaling::PerGroup, true),
        ("current_scaling.json", GroupScaling::Shared, false),
        ("bf16.json", GroupScaling::PerGroup, false),
    ] {
        let m = grouped::<B>(&GroupedLinearConfig::new(4, 256, 256).with_fp8_scales(scaling), name, device);
        let layout = m.layout(splits::<AD<B>>(&case, device), tokens).unwrap();
        let (qx, qw, weight_groups) = expert_operands(&m, &layout, scaling, device, |w, i| {
            (((i * 5 + [2, 9][w]) % 11) as f32 - 5.0) / [4.0, 64.0][w]
        });
        for kind in [GemmKind::Fprop, GemmKind::Dgrad] {
            let x_op = GroupedOperand { tensor: &qx, groups: &layout.groups };
            let w_op = GroupedOperand { tensor: &qw, groups: &weight_groups };
            let what = format!("{name} {scaling:?} {kind:?}");
            let scaled = B::grouped_gemm(kind, x_op, w_op, GemmOptions::default()).unwrap();
            let (unit, scales) = B::grouped_gemm_unscaled(kind, x_op, w_op, GemmOptions::default()).unwrap();
            assert_eq!(scales.is_some(), deferred, "{what}: scales left to the consumer");
            let floats = |t| values(Tensor::<B, 2>::from_primitive(TensorPrimitive::Float(t)));
            let epilogue = |gather| GroupEpilogue { bias: None, scales: scales.clone(), gather };
            let finished = match &scales {
                Some(_) => B::grouped_epilogue(unit.clone(), layout.row_group.clone(), epilogue(None)),
                None => unit.clone(),
            };
            let (scaled, finished) = (floats(scaled), floats(finished));
            // Token rows as the scale pass gives them; padding rows (non-zero in these synthetic
            // operands, zero in a real layout) zero, where the pass scales them as group rows.
            let labels = values(Tensor::<B, 1, Int>::from_primitive(layout.row_group.clone()).float());
            let cols = scaled.len() / layout.rows();
            for (r, &g) in labels.iter().enumerate() {
                let (s_row, f_row) = (&scaled[r * cols..(r + 1) * cols], &finished[r * cols..(r + 1) * cols]);
                if (g as usize) < layout.groups.count || !deferred {
                    assert!(s_row == f_row, "{what}: row {r}: the epilogue's scaling differs from the scale pass");
                } else {
                    assert!(f_row.iter().all(|&v| v == 0.0), "{what}: padding row {r} is not zero");
                }
            }
            if scales.is_some() {
                let tokens_out = floats(B::grouped_epilogue(
                    unit,
                    layout.row_group.clone(),
                    epilogue(Some(layout.packed_to_aligned.clone())),
                ));
                let map = values(Tensor::<B, 1, Int>::from_primitive(layout.packed_to_aligned.clone()).float());
                for (t, &r) in map.iter().enumerate() {
                    let r = r as usize;
                    assert!(
                        tokens_out[t * cols..(t + 1) * cols] == scaled[r * cols..(r + 1) * cols],
                        "{what}: token {t} (aligned row {r}) of the gathered epilogue"
                    );
                }
            }
        }
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

/// FP8 current scaling (E4M3, or E5M2 for the hybrid recipes' gradients) and BF16
/// pass-through: the quantizers the grouped GEMM path checks below compare.
fn fp8_current(fp8: burn_lowp::format::Fp8Format) -> burn_lowp::quant::QuantizerSpec {
    burn_lowp::quant::QuantizerSpec::Fp8Current {
        fp8,
        pow2_scales: false,
        amax_epsilon: 0.0,
    }
}

fn bf16_identity() -> burn_lowp::quant::QuantizerSpec {
    burn_lowp::quant::QuantizerSpec::Identity {
        dtype: burn_lowp::quant::IdentityDtype::Bf16,
    }
}

/// Large groups whose splits the host already knows (CUDA): where every group's GEMM fills the
/// GPU, BF16 dgrad and FP8 fprop/dgrad with per-expert scales run one GEMM per group, the rest
/// keep the pointer array (`backend::per_group_pays`); before the splits' copy has arrived every
/// fprop/dgrad runs the pointer array. Both give the same products on every group row (relative
/// error <= 4e-3: other algorithms, and for per-expert FP8 the pointer array's extra BF16
/// rounding before its scale pass), and the per-group output's tail rows are zero.
pub fn check_grouped_large_known_groups_run_per_group<B: LowpBackend>(device: &B::Device) {
    use burn::tensor::TensorPrimitive;
    use burn_lowp::backend::{GemmKind, GemmOptions, GemmPath, GroupedGemmPath, GroupedOperand, Groups};
    use burn_lowp::format::grouped::{uniform_groups, GroupScaling};
    use burn_lowp::format::Usage;
    use burn_lowp::quant::grouped::quantize_grouped;
    let _turn = turn();
    // Two experts of 4096 aligned rows, 2048 -> 2048: 32 x 16 output tiles per group, three waves
    // on any GPU of up to 170 multiprocessors (an H100 has 132).
    let (features, tokens) = (2048, 8096);
    let case = [4096i64, 4000];
    let layout = B::grouped_layout(splits::<B>(&case, device).into_primitive(), tokens).unwrap();
    layout.check().unwrap();
    let filled = 8192;
    let unknown = Groups::<B> {
        host: layout.groups.host.unresolved(),
        ..layout.groups.clone()
    };
    let weight_groups = Groups::<B>::from_host(uniform_groups(2, features), 2 * features, device).unwrap();
    let x = Tensor::<B, 2>::random([layout.rows(), features], Distribution::Normal(0.0, 1.0), device);
    let w = Tensor::<B, 2>::random([2 * features, features], Distribution::Normal(0.0, 0.02), device);
    let (fp8, bf16) = (fp8_current(burn_lowp::format::Fp8Format::E4M3), bf16_identity());
    let (pa, pg) = (GroupedGemmPath::PointerArray, GroupedGemmPath::PerGroup);
    let (hp, fp8_path) = (GemmPath::CublasLtHighPrecision, GemmPath::CublasLtFp8Tensor);
    for (name, spec, scaling, fprop, dgrad) in [
        ("bf16", &bf16, GroupScaling::PerGroup, pa(hp), pg(hp)),
        ("fp8 per-expert scales", &fp8, GroupScaling::PerGroup, pg(fp8_path), pg(fp8_path)),
        ("fp8 shared scales", &fp8, GroupScaling::Shared, pa(fp8_path), pa(fp8_path)),
    ] {
        let quantize = |t: &Tensor<B, 2>, groups: &Groups<B>| {
            quantize_grouped::<B>(t.clone().into_primitive().tensor(), groups, spec, Usage::BOTH, 0, None, scaling)
                .unwrap()
        };
        let (qx, qw) = (quantize(&x, &layout.groups), quantize(&w, &weight_groups));
        for (kind, want) in [(GemmKind::Fprop, fprop), (GemmKind::Dgrad, dgrad)] {
            let run = |groups: &Groups<B>| {
                let a = GroupedOperand { tensor: &qx, groups };
                let b = GroupedOperand {
                    tensor: &qw,
                    groups: &weight_groups,
                };
                let path = B::grouped_gemm_path(kind, a, b);
                let out = B::grouped_gemm(kind, a, b, GemmOptions::default()).unwrap();
                (path, values(Tensor::<B, 2>::from_primitive(TensorPrimitive::Float(out))))
            };
            let (known_path, known) = run(&layout.groups);
            let (unknown_path, before_copy) = run(&unknown);
            assert_eq!(known_path, want, "{name} {kind:?}: splits on the host");
            assert!(
                matches!(unknown_path, GroupedGemmPath::PointerArray(_)),
                "{name} {kind:?}: before the splits' copy the pointer array runs, not {unknown_path:?}"
            );
            let cut = filled * features;
            let err = relative_error(&known[..cut], &before_copy[..cut]);
            assert!(err <= 4e-3, "{name} {kind:?}: {known_path:?} and the pointer array differ by {err:.2e}");
            check_product_then_zero_rows(&known, cut, &format!("{name} {kind:?}: {known_path:?}"));
        }
    }
}

/// Our Hopper grouped GEMM (CUDA, `GroupedKernel::Sm90`, restored afterwards even on failure):
/// where the splits' host copy has not arrived, a grouped fprop/dgrad with BF16 output runs our
/// kernel instead of cuBLASLt's bound batch (`device_grouped_batches`, not `bound_batches`) and
/// gives cuBLASLt's exact batch's products on every group row (relative error <= 4e-3: another
/// summation order, and for per-expert FP8 scales applied before the one BF16 rounding instead of
/// a scale pass after it), with zeros in the rows past the filled chunks; under BF16 and FP8
/// current scaling (per-expert and shared scales; and the hybrid recipes' dgrad, E5M2 gradient
/// rows with E4M3 weights, per-expert scales), on the skewed splits with an empty expert, at
/// 256 -> 256, 512 -> 384, 2304 -> 384 and 256 -> 2304 features (BF16's cooperative kernels at
/// every length; FP8's pingpong and cooperative kernels). Per-expert scales left to the caller
/// (`grouped_gemm_unscaled`) stay the caller's: the unit-scale product and the epilogue give
/// the same token rows. On a GPU that is not sm_90 (`sm90` false) the setting falls back to the
/// bound batch, which gives the same products.
#[cfg(feature = "cuda")]
pub fn check_grouped_sm90_bound_equals_the_exact_batch<B: LowpBackend>(device: &B::Device, sm90: bool) {
    use burn::tensor::{FloatDType, TensorPrimitive};
    use burn_lowp::backend::cuda::sm90_grouped::{grouped_kernel, set_grouped_kernel, GroupedKernel};
    use burn_lowp::backend::{host_syncs, GemmKind, GemmOptions, GroupEpilogue, GroupedOperand, Groups};
    use burn_lowp::format::grouped::{uniform_groups, GroupScaling};
    use burn_lowp::format::Usage;
    use burn_lowp::quant::grouped::quantize_grouped;
    let _turn = turn();
    /// Puts the setting back when the check ends, failed or not.
    struct Restore(GroupedKernel);
    impl Drop for Restore {
        fn drop(&mut self) {
            set_grouped_kernel(self.0);
        }
    }
    let _restore = Restore(grouped_kernel());
    set_grouped_kernel(GroupedKernel::Sm90);
    // Aligned groups of 384, 0, 128 and 256 rows: 6 chunks filled of the bound's 8.
    let case = [300i64, 0, 17, 195];
    let (tokens, experts, filled_rows) = (512, case.len(), 768);
    let layout = B::grouped_layout(splits::<B>(&case, device).into_primitive(), tokens).unwrap();
    // Reads the splits (waits for their copy): the layout's groups are known on the host.
    layout.check().unwrap();
    assert_eq!(layout.rows(), 1024, "the bound of the case");
    let unknown = Groups::<B> {
        host: layout.groups.host.unresolved(),
        ..layout.groups.clone()
    };
    let labels = values(Tensor::<B, 1, Int>::from_primitive(layout.row_group.clone()).float());
    let (fp8, bf16) = (fp8_current(burn_lowp::format::Fp8Format::E4M3), bf16_identity());
    let fp8_e5m2 = fp8_current(burn_lowp::format::Fp8Format::E5M2);
    let options = || GemmOptions::<B> {
        out_dtype: FloatDType::BF16,
        ..GemmOptions::default()
    };
    let floats = |t| values(Tensor::<B, 2>::from_primitive(TensorPrimitive::Float(t)));
    // FP8's short reductions take the pingpong kernel; 2304 (fprop of the third, dgrad of the
    // fourth) the cooperative one. BF16 is cooperative throughout.
    for (inp, out) in [(256, 256), (512, 384), (2304, 384), (256, 2304)] {
        let weight_groups =
            Groups::<B>::from_host(uniform_groups(experts, out), experts * out, device).unwrap();
        let x = Tensor::<B, 2>::random([layout.rows(), inp], Distribution::Normal(0.0, 1.0), device);
        let dy = Tensor::<B, 2>::random([layout.rows(), out], Distribution::Normal(0.0, 1.0), device);
        let w = Tensor::<B, 2>::random([experts * out, inp], Distribution::Normal(0.0, 0.05), device);
        // (name, the spec of x and w, of dY, scaling, whether the per-expert scales can be left to
        // the caller).
        for (name, spec, dy_spec, scaling, deferrable) in [
            ("bf16", &bf16, &bf16, GroupScaling::PerGroup, false),
            ("fp8 per-expert scales", &fp8, &fp8, GroupScaling::PerGroup, true),
            ("fp8 shared scales", &fp8, &fp8, GroupScaling::Shared, false),
            ("fp8 hybrid per-expert scales", &fp8, &fp8_e5m2, GroupScaling::PerGroup, true),
        ] {
            let quantize = |t: &Tensor<B, 2>, groups: &Groups<B>, spec| {
                quantize_grouped::<B>(t.clone().into_primitive().tensor(), groups, spec, Usage::BOTH, 0, None, scaling)
                    .unwrap()
            };
            let (qx, qdy, qw) = (
                quantize(&x, &layout.groups, spec),
                quantize(&dy, &layout.groups, dy_spec),
                quantize(&w, &weight_groups, spec),
            );
            // (The hybrid fprop is the per-expert case's: E4M3 both sides.)
            let kinds = if name.contains("hybrid") {
                vec![(GemmKind::Dgrad, &qdy)]
            } else {
                vec![(GemmKind::Fprop, &qx), (GemmKind::Dgrad, &qdy)]
            };
            for (kind, rows_operand) in kinds {
                let what = format!("{name} {inp} -> {out} {kind:?}");
                let w_op = GroupedOperand {
                    tensor: &qw,
                    groups: &weight_groups,
                };
                // (out, (exact, bound, device-grouped batches, split reads)).
                let run = |groups: &Groups<B>| {
                    let a = GroupedOperand {
                        tensor: rows_operand,
                        groups,
                    };
                    let before = host_syncs();
                    let out = floats(B::grouped_gemm(kind, a, w_op, options()).unwrap());
                    let c = host_syncs().since(&before);
                    (out, (c.exact_batches, c.bound_batches, c.device_grouped_batches, c.split_reads))
                };
                let (exact, counts) = run(&layout.groups);
                assert_eq!(counts, (1, 0, 0, 0), "{what}: the exact batch (cuBLASLt)");
                let (bound, counts) = run(&unknown);
                let (wanted, ran) = if sm90 {
                    ((0, 0, 1, 0), "our sm90 kernel")
                } else {
                    ((0, 1, 0, 0), "cuBLASLt's bound batch (not an sm_90 GPU)")
                };
                assert_eq!(counts, wanted, "{what}: before the splits' copy, {ran} runs");
                let cols = exact.len() / layout.rows();
                assert_eq!(cols, [out, inp][(kind == GemmKind::Dgrad) as usize], "{what}: output columns");
                let cut = filled_rows * cols;
                let err = relative_error(&bound[..cut], &exact[..cut]);
                assert!(err <= 4e-3, "{what}: {ran} and the exact batch differ by {err:.2e}");
                check_product_then_zero_rows(&exact, cut, &format!("{what}: the exact batch"));
                check_product_then_zero_rows(&bound, cut, &format!("{what}: {ran}"));

                if deferrable {
                    // Deferred scales: the unit-scale product, scaled once by the epilogue.
                    let a = GroupedOperand {
                        tensor: rows_operand,
                        groups: &unknown,
                    };
                    let before = host_syncs();
                    let (unit, scales) = B::grouped_gemm_unscaled(kind, a, w_op, options()).unwrap();
                    assert!(scales.is_some(), "{what}: per-expert scales left to the caller");
                    let finished = floats(B::grouped_epilogue(
                        unit,
                        layout.row_group.clone(),
                        GroupEpilogue {
                            bias: None,
                            scales,
                            gather: None,
                        },
                    ));
                    // (Counted when CubeCL's device thread runs the batch: read after the output.)
                    let c = host_syncs().since(&before);
                    assert_eq!(
                        (c.exact_batches, c.bound_batches, c.device_grouped_batches),
                        (wanted.0, wanted.1, wanted.2),
                        "{what}: deferred scales, before the splits' copy, {ran} runs"
                    );
                    // Token rows (the epilogue zeroes padding rows, which these operands fill).
                    let token_rows = |v: &[f32]| {
                        labels
                            .iter()
                            .enumerate()
                            .filter(|(_, &g)| (g as usize) < experts)
                            .flat_map(|(r, _)| v[r * cols..(r + 1) * cols].to_vec())
                            .collect::<Vec<f32>>()
                    };
                    let err = relative_error(&token_rows(&finished), &token_rows(&exact));
                    assert!(err <= 4e-3, "{what}: deferred scales: {ran} and the exact batch differ by {err:.2e}");
                }
            }
        }
    }
}

/// The splits' host copy is seen as soon as it has arrived, without a read (CUDA, default
/// first-reader resolution): a mark on the stream after the copy tells `try_get`, so a grouped
/// GEMM queued once the GPU has caught up runs its exact batch, and no split read is counted.
pub fn check_grouped_split_copy_is_seen_once_arrived<B: LowpBackend>(device: &B::Device) {
    use burn_lowp::backend::{host_syncs, GemmKind, GemmOptions, GroupedOperand};
    use burn_lowp::format::grouped::GroupScaling;
    let _turn = turn();
    let case = [300i64, 0, 17, 195];
    let m = grouped::<B>(&GroupedLinearConfig::new(4, 256, 256), "bf16.json", device);
    let before = host_syncs();
    let layout = m.layout(splits::<AD<B>>(&case, device), 512).unwrap();
    B::sync(device).unwrap();
    let started = std::time::Instant::now();
    let host = loop {
        if let Some(host) = layout.groups.host.try_get() {
            break host;
        }
        assert!(started.elapsed().as_secs() < 10, "the splits' copy was never seen without a read");
        std::thread::sleep(std::time::Duration::from_millis(1));
    };
    let lens: Vec<usize> = host.groups.iter().map(|g| g.len).collect();
    assert_eq!(lens, [384, 0, 128, 256], "the aligned groups of the case");
    let (qx, qw, weight_groups) =
        expert_operands(&m, &layout, GroupScaling::PerGroup, device, |_, i| ((i % 5) as f32 - 2.0) / 4.0);
    let x_op = GroupedOperand {
        tensor: &qx,
        groups: &layout.groups,
    };
    let w_op = GroupedOperand {
        tensor: &qw,
        groups: &weight_groups,
    };
    let _ = B::grouped_gemm(GemmKind::Fprop, x_op, w_op, GemmOptions::default()).unwrap();
    B::sync(device).unwrap();
    let counts = host_syncs().since(&before);
    assert_eq!(
        (counts.exact_batches, counts.bound_batches, counts.split_reads),
        (1, 0, 0),
        "an exact batch, and no read of the splits"
    );
}
