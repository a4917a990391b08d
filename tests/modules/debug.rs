//! The precision debug tools on modules (`burn_lowp::debug`), written once and instantiated per
//! backend by `debug_suite!`: a scripted run where one layer's gradient underflows switches
//! exactly that layer's dgrad and wgrad in that iteration (high-precision results) and releases
//! them when it recovers, in both timings; per-expert switching in GroupedLinear; disabled GEMMs
//! equal plain Burn; logged statistics (micro-batches accumulated) equal a host reference.
#![allow(dead_code)]

use std::path::Path;
use std::sync::Arc;

use burn::backend::Autodiff;
use burn::tensor::{Distribution, Int, Tensor, TensorData};
use burn_lowp::backend::LowpBackend;
use burn_lowp::debug::{DebugConfig, DebugSession, SwitchRecord};
use burn_lowp::format::{self, Fp8CurrentScaling, Fp8Format, FormatConfig, HostMatrix, InputDtype, Usage};
use burn_lowp::nn::{GroupedLinearConfig, LinearConfig};

use crate::suite::{recipe, Exactness};

type AD<B> = Autodiff<B>;

fn host<B: burn::tensor::backend::Backend, const D: usize>(t: Tensor<B, D>) -> Vec<f32> {
    t.into_data().convert::<f32>().to_vec::<f32>().unwrap()
}

fn session(config: &str, dir: &Path) -> Arc<DebugSession> {
    DebugSession::new(DebugConfig::from_json(config).unwrap(), dir, 0).unwrap()
}

fn switch_records(dir: &Path) -> Vec<SwitchRecord> {
    std::fs::read_to_string(dir.join("autoswitch-rank0.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// `(iteration, layer, gemm, event)` of every sample that switched or released.
fn transitions(records: &[SwitchRecord]) -> Vec<(u64, String, String, String)> {
    records
        .iter()
        .filter(|r| r.kind == "sample" && matches!(r.event.as_deref(), Some("switch" | "release")))
        .map(|r| (r.iteration, r.layer.clone(), r.gemm.name().to_string(), r.event.clone().unwrap()))
        .collect()
}

/// A gradient whose values are ~1e-11 except one outlier of 1 at `[0, 0]`: with current scaling
/// (scale = 57344 / 1 for E5M2) every other value falls below E5M2's smallest subnormal.
fn underflowing<B: burn::tensor::backend::Backend>(rows: usize, cols: usize, device: &B::Device) -> Tensor<B, 2> {
    let t = Tensor::<B, 2>::random([rows, cols], Distribution::Normal(0.0, 1.0), device).mul_scalar(1e-11);
    let outlier = Tensor::<B, 2>::from_data(TensorData::new(vec![1.0f32], [1, 1]), device);
    t.slice_assign([0..1, 0..1], outlier)
}

/// Relative Frobenius error of `got` against `want` over rows `1..` (`[rows, cols]`), leaving out
/// row 0, which the outlier dominates and which quantization keeps.
fn tiny_rows_error(got: &[f32], want: &[f32], cols: usize) -> f64 {
    let (mut num, mut den) = (0.0f64, 0.0f64);
    for i in cols..got.len() {
        num += (got[i] as f64 - want[i] as f64).powi(2);
        den += (want[i] as f64).powi(2);
    }
    (num / den.max(1e-300)).sqrt()
}

const AUTOSWITCH: &str = r#"{
  "all": {
    "layers": { "layer_types": ["linear"] },
    "features": { "AutoswitchGemm": { "mse_threshold": null, "high_precision_source": "original", "timing": "TIMING" } }
  }
}"#;

/// Layers `a` and `b` on their own inputs; `b`'s output gradient underflows in iteration 1 (same
/// iteration timing: b's dgrad and wgrad switch in 1, their results the high-precision ones, and
/// release in 2), or in iterations 1 and 2 (next-sample timing: the breach measured in 1 switches
/// them in 2, the one measured in 2 holds them in 3, the clean 3 releases them in 4). Nothing
/// else switches.
pub fn check_autoswitch_scripted_underflow<B: LowpBackend>(device: &B::Device, exactness: Exactness) {
    for timing in ["same_iteration", "next_sample"] {
        let dir = tempfile::tempdir().unwrap();
        let s = session(&AUTOSWITCH.replace("TIMING", timing), dir.path());
        let guard = s.install();
        let r = recipe("current_scaling.json");
        let a = LinearConfig::new(64, 64).with_bias(false).with_name("a".into()).init::<AD<B>>(&r, device).unwrap();
        let b = LinearConfig::new(64, 64).with_bias(false).with_name("b".into()).init::<AD<B>>(&r, device).unwrap();
        let same = timing == "same_iteration";
        let (switched_at, release, high) = if same { (1, 2, vec![1]) } else { (2, 4, vec![2, 3]) };
        for it in 0..5u64 {
            let xa = Tensor::<AD<B>, 2>::random([64, 64], Distribution::Normal(0.0, 1.0), device).require_grad();
            let xb = Tensor::<AD<B>, 2>::random([64, 64], Distribution::Normal(0.0, 1.0), device).require_grad();
            let ga = Tensor::<AD<B>, 2>::random([64, 64], Distribution::Normal(0.0, 1.0), device);
            let gb = if it == 1 || (it == 2 && !same) {
                underflowing::<AD<B>>(64, 64, device)
            } else {
                Tensor::random([64, 64], Distribution::Normal(0.0, 1.0), device)
            };
            let loss = (a.forward(xa).unwrap() * ga).sum() + (b.forward(xb.clone()).unwrap() * gb.clone()).sum();
            let grads = loss.backward();
            if it == switched_at {
                // High-precision dW = gᵀ·x and dX = g·W, where quantized ones would be ~0.
                let (g, x, w) = (gb.inner(), xb.clone().inner(), b.weight.val().inner());
                let dw_ref = host(g.clone().transpose().matmul(x));
                let dx_ref = host(g.matmul(w));
                let dw = host(b.weight.grad(&grads).unwrap());
                let dx = host(xb.grad(&grads).unwrap());
                let bound = match exactness {
                    Exactness::Reference => 1e-5,
                    Exactness::Gpu => 1e-2,
                };
                let (edw, edx) = (tiny_rows_error(&dw, &dw_ref, 64), tiny_rows_error(&dx, &dx_ref, 64));
                assert!(edw <= bound && edx <= bound, "{timing}: switched b: dW error {edw}, dX error {edx}");
            }
            s.step().unwrap();
        }
        s.finish().unwrap();
        drop(guard);
        let mut got = transitions(&switch_records(dir.path()));
        got.sort();
        let b = |it: u64, gemm: &str, event: &str| (it, "b".to_string(), gemm.to_string(), event.to_string());
        let mut want = vec![
            b(switched_at, "dgrad", "switch"),
            b(switched_at, "wgrad", "switch"),
            b(release, "dgrad", "release"),
            b(release, "wgrad", "release"),
        ];
        want.sort();
        assert_eq!(got, want, "{timing}: switches");
        let hp: Vec<_> = switch_records(dir.path())
            .into_iter()
            .filter(|r| r.kind == "high_precision")
            .map(|r| (r.iteration, r.layer, r.gemm.name().to_string()))
            .collect();
        assert_eq!(hp.len(), 2 * high.len(), "{timing}: high-precision GEMMs {hp:?}");
        assert!(hp.iter().all(|(it, l, _)| high.contains(it) && l == "b"), "{timing}: {hp:?}");
    }
}

/// GroupedLinear: expert 2's tokens get the underflowing gradient; only expert 2's dgrad and
/// wgrad switch (layer `experts.gemm_2`), and the debug path's output equals the plain path's.
pub fn check_grouped_per_expert_switch<B: LowpBackend>(device: &B::Device, exactness: Exactness) {
    let dir = tempfile::tempdir().unwrap();
    let config = r#"{ "experts": { "layers": { "layer_types": ["grouped_linear"] },
        "features": { "AutoswitchGemm": { "mse_threshold": null, "high_precision_source": "original" } } } }"#;
    let r = recipe("current_scaling.json");
    let layer = GroupedLinearConfig::new(4, 64, 128).with_bias(true).with_name("experts".into()).init::<AD<B>>(&r, device).unwrap();
    let splits = [40i64, 0, 64, 24];
    let tokens: usize = splits.iter().sum::<i64>() as usize;
    let m_splits = || Tensor::<AD<B>, 1, Int>::from_data(TensorData::new(splits.to_vec(), [4]), device);
    let x = Tensor::<AD<B>, 2>::random([tokens, 64], Distribution::Normal(0.0, 1.0), device);
    let plain = host(layer.forward(x.clone(), m_splits()).unwrap());
    let s = session(config, dir.path());
    let guard = s.install();
    let debugged = layer.forward(x.clone().require_grad(), m_splits()).unwrap();
    let y = host(debugged.clone());
    let err = tiny_rows_error(&y, &plain, 0);
    let bound = match exactness {
        Exactness::Reference => 1e-6,
        Exactness::Gpu => 1e-2,
    };
    assert!(err <= bound, "debug path output differs from the grouped path: {err}");
    // Expert 2 holds tokens 40..104: its gradient rows underflow, the others are ordinary.
    let normal = Tensor::<AD<B>, 2>::random([tokens, 128], Distribution::Normal(0.0, 1.0), device);
    let g = normal.slice_assign([40..104, 0..128], underflowing::<AD<B>>(64, 128, device));
    let _ = (debugged * g).sum().backward();
    s.step().unwrap();
    s.finish().unwrap();
    drop(guard);
    let mut got = transitions(&switch_records(dir.path()));
    got.sort();
    let e2 = |gemm: &str| (0, "experts.gemm_2".to_string(), gemm.to_string(), "switch".to_string());
    assert_eq!(got, vec![e2("dgrad"), e2("wgrad")]);
    // The empty expert has no GEMMs, hence no samples.
    assert!(switch_records(dir.path()).iter().all(|r| r.layer != "experts.gemm_1"));
    // Nothing above reads the backward's gradients, so launches may still be queued. Wait for
    // them: a process that exits while CubeCL's device thread compiles one of them crashes in
    // NVRTC as exit unloads it (3 of 48 runs of this test alone on an H100, 2026-11-27).
    B::sync(device).unwrap();
}

/// The experts-one-by-one path of a debugged GroupedLinear (nothing switched; a PerTensorScaling
/// feature, which changes nothing under current scaling, takes the layer off its grouped GEMMs)
/// gives the grouped path's input and weight gradients (the same quantized operands; the GEMMs
/// group their sums differently).
pub fn check_grouped_debug_path_gradients<B: LowpBackend>(device: &B::Device, exactness: Exactness) {
    let dir = tempfile::tempdir().unwrap();
    let config = r#"{ "experts": { "layers": { "layer_types": ["grouped_linear"] },
        "features": { "LogTensorStats": { "tensors": ["activation", "gradient"], "stats": ["max"] },
                      "PerTensorScaling": { "gemms": ["fprop"], "tensors": ["weight"] } } } }"#;
    let layer = GroupedLinearConfig::new(4, 64, 128).with_bias(true).with_name("experts".into())
        .init::<AD<B>>(&recipe("current_scaling.json"), device).unwrap();
    let splits = [40i64, 0, 64, 24];
    let m_splits = || Tensor::<AD<B>, 1, Int>::from_data(TensorData::new(splits.to_vec(), [4]), device);
    let x = Tensor::<AD<B>, 2>::random([128, 64], Distribution::Normal(0.0, 1.0), device);
    let g = Tensor::<AD<B>, 2>::random([128, 128], Distribution::Normal(0.0, 1.0), device);
    let grads = |debugged: bool| {
        let s = session(config, dir.path());
        let guard = debugged.then(|| s.install());
        let x = x.clone().require_grad();
        let grads = (layer.forward(x.clone(), m_splits()).unwrap() * g.clone()).sum().backward();
        drop(guard);
        let bias = layer.bias.as_ref().unwrap().grad(&grads).unwrap();
        (host(x.grad(&grads).unwrap()), host(layer.weight.grad(&grads).unwrap()), host(bias))
    };
    let (plain, debugged) = (grads(false), grads(true));
    let bound = match exactness {
        Exactness::Reference => 1e-5,
        Exactness::Gpu => 1e-2,
    };
    for (what, a, b) in [("dX", &debugged.0, &plain.0), ("dW", &debugged.1, &plain.1), ("db", &debugged.2, &plain.2)] {
        let e = tiny_rows_error(a, b, 0);
        assert!(e <= bound, "{what}: experts one by one vs grouped: {e}");
    }
}

const OBSERVING: &str = r#"{ "experts": { "layers": { "layer_types": ["grouped_linear"] }, "features": {
    "LogTensorStats": { "tensors": ["activation", "weight", "output", "gradient", "dgrad", "wgrad"],
                        "stats": ["min", "max", "mean", "std", "l2_norm", "cur_amax", "dynamic_range", "max_blockwise_dynamic_range_1d"] },
    "LogQuantizedTensorStats": { "tensors": ["activation", "gradient", "weight"],
                                 "stats": ["underflows%", "mse", "scale_inv_min", "scale_inv_max"], "columnwise": true },
    "AutoswitchGemm": { "mse_threshold": null, "timing": "next_sample" }EXTRA } } }"#;

/// A debugged GroupedLinear whose features only observe (statistics, next-sample AutoswitchGemm
/// metrics) keeps its grouped GEMMs and its weight quantization (one per forward, not one per
/// expert), and its output and gradients equal the undebugged layer's bit for bit on the
/// reference backend; its per-expert statistics and AutoswitchGemm samples equal those of the
/// experts-one-by-one path (forced here by a PerTensorScaling feature, which changes nothing under
/// current scaling), and the empty expert reports nothing.
pub fn check_grouped_observing_keeps_grouped_gemms<B: LowpBackend>(device: &B::Device, exactness: Exactness) {
    let layer = GroupedLinearConfig::new(4, 64, 128).with_bias(true).with_name("experts".into())
        .init::<AD<B>>(&recipe("current_scaling.json"), device).unwrap();
    let splits = [40i64, 0, 64, 24];
    let m_splits = || Tensor::<AD<B>, 1, Int>::from_data(TensorData::new(splits.to_vec(), [4]), device);
    let x = Tensor::<AD<B>, 2>::random([128, 64], Distribution::Normal(0.0, 1.0), device);
    let g = Tensor::<AD<B>, 2>::random([128, 128], Distribution::Normal(0.0, 1.0), device);
    let _turn = crate::grouped::turn();
    // Two iterations (the second applies the first's AutoswitchGemm samples); per iteration the
    // output, dX, dW, db and the weight quantizations of the forward.
    let run = |config: Option<&str>, dir: &Path, observe_only: bool| {
        let s = config.map(|c| session(c, dir));
        let guard = s.as_ref().map(|s| s.install());
        let mut out = Vec::new();
        for it in 0..2 {
            let x = x.clone().require_grad();
            let before = layer.weight_quantizations();
            let reads = burn_lowp::backend::host_syncs();
            let y = layer.forward(x.clone(), m_splits()).unwrap();
            // Observing every expert reads no split size on the host (on device backends, whose
            // splits' host copy is still on its way; NdArray's layouts come from the host).
            if observe_only {
                let reads = burn_lowp::backend::host_syncs().since(&reads).split_reads;
                assert_eq!(reads, 0, "iteration {it}: an observing forward read the splits on the host");
            }
            let quantizations = layer.weight_quantizations() - before;
            let grads = (y.clone() * g.clone()).sum().backward();
            let bias = layer.bias.as_ref().unwrap().grad(&grads).unwrap();
            out.push((
                [host(y), host(x.grad(&grads).unwrap()), host(layer.weight.grad(&grads).unwrap()), host(bias)],
                quantizations,
            ));
            if let Some(s) = &s {
                s.step().unwrap();
            }
        }
        if let Some(s) = &s {
            s.finish().unwrap();
        }
        drop(guard);
        out
    };
    let (plain_dir, grouped_dir, one_by_one_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let plain = run(None, plain_dir.path(), false);
    let grouped = run(Some(&OBSERVING.replace("EXTRA", "")), grouped_dir.path(), true);
    let one_by_one = run(
        Some(&OBSERVING.replace("EXTRA", r#", "PerTensorScaling": { "gemms": ["fprop"], "tensors": ["weight"] }"#)),
        one_by_one_dir.path(),
        false,
    );
    for (it, ((p, pq), ((d, dq), (_, oq)))) in plain.iter().zip(grouped.iter().zip(&one_by_one)).enumerate() {
        assert_eq!((*pq, *dq, *oq), (1, 1, 3), "iteration {it}: weight quantizations (plain, observed, one by one)");
        for (what, a, b) in [("y", &d[0], &p[0]), ("dX", &d[1], &p[1]), ("dW", &d[2], &p[2]), ("db", &d[3], &p[3])] {
            match exactness {
                Exactness::Reference => assert_eq!(a, b, "iteration {it}: observed {what} equals the undebugged one"),
                Exactness::Gpu => assert!(tiny_rows_error(a, b, 0) <= 1e-6, "iteration {it}: observed {what}"),
            }
        }
    }
    // (iteration, layer, tensor, stat) -> value
    let stats = |dir: &Path| -> std::collections::BTreeMap<(u64, String, String, String), f64> {
        std::fs::read_to_string(dir.join("debug_stats-rank0.jsonl"))
            .unwrap()
            .lines()
            .map(|l| {
                let r: serde_json::Value = serde_json::from_str(l).unwrap();
                let key = (r["iteration"].as_u64().unwrap(), r["layer"].as_str().unwrap().to_string(),
                           r["tensor"].as_str().unwrap().to_string(), r["stat"].as_str().unwrap().to_string());
                (key, r["value"].as_f64().unwrap_or(f64::NAN))
            })
            .collect()
    };
    let (a, b) = (stats(grouped_dir.path()), stats(one_by_one_dir.path()));
    assert_eq!(a.keys().collect::<Vec<_>>(), b.keys().collect::<Vec<_>>(), "the same statistics are logged");
    let experts: std::collections::BTreeSet<_> = a.keys().map(|k| k.1.clone()).collect();
    assert_eq!(experts.into_iter().collect::<Vec<_>>(), ["experts.gemm_0", "experts.gemm_2", "experts.gemm_3"]);
    for tensor in ["activation", "weight", "output", "gradient", "dgrad", "wgrad"] {
        assert!(a.keys().any(|k| k.2 == tensor), "{tensor} logged");
    }
    // Identical partials on the reference backend; on a GPU the per-expert and grouped GEMMs
    // round their sums differently (output, dgrad, wgrad).
    let bound = match exactness {
        Exactness::Reference => 1e-9,
        Exactness::Gpu => 1e-2,
    };
    for (key, va) in &a {
        let vb = b[key];
        let close = (va - vb).abs() <= bound * vb.abs().max(1e-3) || (va.is_nan() && vb.is_nan());
        assert!(close, "{key:?}: observed {va} vs one by one {vb}");
    }
    // AutoswitchGemm: the samples taken in iteration 1 (from iteration 0's metrics), per expert
    // and GEMM, with the same metrics.
    let samples = |dir: &Path| -> Vec<(u64, String, String, f64, f64)> {
        let mut v: Vec<_> = switch_records(dir)
            .into_iter()
            .filter(|r| r.kind == "sample")
            .map(|r| {
                let m = r.metrics.unwrap();
                (r.iteration, r.layer, r.gemm.name().to_string(), m["underflow_pct"].as_f64().unwrap(), m["mse"].as_f64().unwrap())
            })
            .collect();
        v.sort_by(|x, y| (x.0, &x.1, &x.2).cmp(&(y.0, &y.1, &y.2)));
        v
    };
    let (sa, sb) = (samples(grouped_dir.path()), samples(one_by_one_dir.path()));
    assert_eq!(sa.len(), 3 * 3, "a sample per expert holding tokens and GEMM: {sa:?}");
    for (x, y) in sa.iter().zip(&sb) {
        assert_eq!((x.0, &x.1, &x.2), (y.0, &y.1, &y.2));
        assert_eq!(x.0, 1);
        assert!((x.3 - y.3).abs() <= 1e-9 && (x.4 - y.4).abs() <= bound * y.4.max(1e-12), "{x:?} vs {y:?}");
    }
}

/// DisableQuantizationGEMM on fprop: the output is the plain high-precision product.
pub fn check_disabled_fprop_is_high_precision<B: LowpBackend>(device: &B::Device, exactness: Exactness) {
    let dir = tempfile::tempdir().unwrap();
    let s = session(
        r#"{ "off": { "layers": { "layer_name_patterns": ["c*"] }, "features": { "DisableQuantizationGEMM": { "gemms": ["fprop"] } } } }"#,
        dir.path(),
    );
    let _guard = s.install();
    let layer = LinearConfig::new(64, 32).with_bias(false).with_name("c1".into()).init::<AD<B>>(&recipe("current_scaling.json"), device).unwrap();
    let x = Tensor::<AD<B>, 2>::random([32, 64], Distribution::Normal(0.0, 1.0), device);
    let y = host(layer.forward(x.clone()).unwrap());
    let want = host(x.inner().matmul(layer.weight.val().inner().transpose()));
    match exactness {
        Exactness::Reference => assert_eq!(y, want, "disabled fprop equals plain Burn bit for bit"),
        Exactness::Gpu => assert!(tiny_rows_error(&y, &want, 0) <= 8e-3),
    }
}

fn f64s(v: &[f32]) -> Vec<f64> {
    v.iter().map(|&x| x as f64).collect()
}

/// LogTensorStats and LogQuantizedTensorStats over two micro-batches of one iteration equal the
/// statistics of both inputs together, computed on the host (the quantized ones from the
/// reference quantizer), and the what-if MXFP8 statistics appear under their names.
pub fn check_logged_stats_match_host<B: LowpBackend>(device: &B::Device) {
    let dir = tempfile::tempdir().unwrap();
    let config = r#"{ "s": { "layers": { "layer_name_patterns": ["stats"] }, "features": {
        "LogTensorStats": { "tensors": ["activation", "weight", "output", "gradient", "dgrad", "wgrad"],
                            "stats": ["min", "max", "mean", "std", "l1_norm", "l2_norm", "cur_amax", "dynamic_range"] },
        "LogQuantizedTensorStats": { "tensors": ["activation"], "stats": ["underflows%", "mse", "scale_inv_min", "scale_inv_max"],
                                     "columnwise": true, "what_if": ["mxfp8"] } } } }"#;
    let s = session(config, dir.path());
    let guard = s.install();
    let layer = LinearConfig::new(64, 32).with_name("stats".into()).init::<AD<B>>(&recipe("current_scaling.json"), device).unwrap();
    let inputs: Vec<Vec<f32>> = (0..2u64)
        .map(|m| {
            let h = crate::common::random_matrix(32, 64, 40 + m, 3.0);
            h.values
        })
        .collect();
    for values in &inputs {
        let x = Tensor::<AD<B>, 2>::from_data(TensorData::new(values.clone(), [32, 64]), device).require_grad();
        let _ = layer.forward(x).unwrap().sum().backward();
    }
    s.step().unwrap();
    s.finish().unwrap();
    drop(guard);
    let text = std::fs::read_to_string(dir.path().join("debug_stats-rank0.jsonl")).unwrap();
    let records: Vec<serde_json::Value> = text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let get = |tensor: &str, stat: &str| -> f64 {
        let found: Vec<_> = records
            .iter()
            .filter(|r| r["tensor"] == tensor && r["stat"] == stat && r["layer"] == "stats")
            .collect();
        assert_eq!(found.len(), 1, "{tensor} {stat}: one record (micro-batches accumulated)");
        found[0]["value"].as_f64().unwrap()
    };
    let all: Vec<f64> = inputs.iter().flat_map(|v| f64s(v)).collect();
    let n = all.len() as f64;
    let mean = all.iter().sum::<f64>() / n;
    let std = (all.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0)).sqrt();
    let amax = all.iter().fold(0.0f64, |m, x| m.max(x.abs()));
    let close = |got: f64, want: f64, what: &str| {
        assert!((got - want).abs() <= 1e-5 * want.abs().max(1e-12), "{what}: {got} vs {want}")
    };
    close(get("activation", "min"), all.iter().cloned().fold(f64::INFINITY, f64::min), "min");
    close(get("activation", "max"), all.iter().cloned().fold(f64::NEG_INFINITY, f64::max), "max");
    close(get("activation", "mean"), mean, "mean");
    close(get("activation", "std"), std, "std");
    close(get("activation", "l1_norm"), all.iter().map(|x| x.abs()).sum(), "l1");
    close(get("activation", "l2_norm"), all.iter().map(|x| x * x).sum::<f64>().sqrt(), "l2");
    close(get("activation", "cur_amax"), amax, "amax");
    // The gradient of a sum is all ones: mean 1, std 0.
    close(get("gradient", "mean"), 1.0, "gradient mean");
    close(get("gradient", "std") + 1.0, 1.0, "gradient std");
    for t in ["weight", "output", "dgrad", "wgrad"] {
        assert!(get(t, "l2_norm") > 0.0, "{t} logged");
    }
    // Quantized statistics from the reference quantizer (E4M3 current scaling, the recipe's
    // forward format), per micro-batch, accumulated.
    let reference = |config: &FormatConfig, direction| {
        let (mut under, mut sq, mut scales) = (0usize, 0.0f64, Vec::new());
        for v in &inputs {
            let m = HostMatrix::new("x", 32, 64, InputDtype::F32, v.clone()).unwrap();
            let q = format::quantize(&m, config, Usage { rowwise: true, columnwise: true }).unwrap();
            let d = q.dequantize(direction).unwrap();
            under += v.iter().zip(&d).filter(|(x, d)| **x != 0.0 && **d == 0.0).count();
            sq += v.iter().zip(&d).map(|(x, d)| (*x as f64 - *d as f64).powi(2)).sum::<f64>();
            scales.push(v.iter().fold(0.0f32, |m, x| m.max(x.abs())) as f64 / 448.0);
        }
        (100.0 * under as f64 / n, sq / n, scales)
    };
    let fp8 = FormatConfig::Fp8Current(Fp8CurrentScaling::new(Fp8Format::E4M3));
    for (direction, suffix) in [(format::Direction::Rowwise, ""), (format::Direction::Columnwise, "_columnwise")] {
        let (under, mse, scales) = reference(&fp8, direction);
        close(get("activation", &format!("underflows%{suffix}")), under, "underflows");
        close(get("activation", &format!("mse{suffix}")), mse, "mse");
        close(get("activation", &format!("scale_inv_min{suffix}")), scales.iter().cloned().fold(f64::INFINITY, f64::min), "scale_inv_min");
        close(get("activation", &format!("scale_inv_max{suffix}")), scales.iter().cloned().fold(0.0, f64::max), "scale_inv_max");
    }
    let mx = FormatConfig::Mxfp8(format::Mxfp8Config { fp8: Fp8Format::E4M3, block_2d: false });
    let (_, mse, _) = reference(&mx, format::Direction::Rowwise);
    close(get("activation", "mxfp8_mse"), mse, "what-if mxfp8 mse");
    get("activation", "mxfp8_underflows%_columnwise");
}

/// A layer two enabled sections select is an error at its forward, naming both sections.
pub fn check_layer_in_two_sections_is_an_error<B: LowpBackend>(device: &B::Device) {
    let dir = tempfile::tempdir().unwrap();
    let s = session(
        r#"{ "one": { "layers": { "layer_types": ["linear"] }, "features": { "DisableQuantizationLayer": {} } },
             "two": { "layers": { "layer_name_patterns": ["d"] }, "features": { "DisableQuantizationLayer": {} } } }"#,
        dir.path(),
    );
    let _guard = s.install();
    let layer = LinearConfig::new(64, 32).with_name("d".into()).init::<AD<B>>(&recipe("bf16.json"), device).unwrap();
    let x = Tensor::<AD<B>, 2>::zeros([16, 64], device);
    let err = layer.forward(x).unwrap_err().to_string();
    assert!(err.contains("`one`") && err.contains("`two`"), "{err}");
}

macro_rules! debug_suite {
    ($backend:ty, $device:expr, $exactness:expr) => {
        #[test]
        fn autoswitch_switches_exactly_the_underflowing_gemms() {
            if let Some(d) = $device {
                crate::debug::check_autoswitch_scripted_underflow::<$backend>(&d, $exactness);
            }
        }

        #[test]
        fn autoswitch_decides_per_expert() {
            if let Some(d) = $device {
                crate::debug::check_grouped_per_expert_switch::<$backend>(&d, $exactness);
            }
        }

        #[test]
        fn autoswitch_per_expert_path_has_the_grouped_gradients() {
            if let Some(d) = $device {
                crate::debug::check_grouped_debug_path_gradients::<$backend>(&d, $exactness);
            }
        }

        #[test]
        fn observing_a_grouped_layer_keeps_its_grouped_gemms() {
            if let Some(d) = $device {
                crate::debug::check_grouped_observing_keeps_grouped_gemms::<$backend>(&d, $exactness);
            }
        }

        #[test]
        fn disabled_fprop_is_high_precision() {
            if let Some(d) = $device {
                crate::debug::check_disabled_fprop_is_high_precision::<$backend>(&d, $exactness);
            }
        }

        #[test]
        fn logged_statistics_match_the_host() {
            if let Some(d) = $device {
                crate::debug::check_logged_stats_match_host::<$backend>(&d);
            }
        }

        #[test]
        fn a_layer_in_two_sections_is_an_error() {
            if let Some(d) = $device {
                crate::debug::check_layer_in_two_sections_is_an_error::<$backend>(&d);
            }
        }
    };
}
pub(crate) use debug_suite;
