//! LayerNormMLP forward + backward on CUDA, printed as JSON lines (`benches/layernorm_mlp_torch.py`
//! is the PyTorch peer and joins both into ratios).
//!
//! `cargo bench --features cuda --bench layernorm_mlp`:
//! * `mlp_step`: `LayerNormMlp` hidden 4096 -> ffn 16384, 8192 tokens, LayerNorm, bias, BF16
//!   parameters and activations, gelu and swiglu, forward + backward (x, every parameter) under
//!   the bf16, current_scaling (also with fast accumulation in all three GEMMs,
//!   `recipes/current_scaling_fast_accumulation.json`), delayed_scaling, block_scaling and mxfp8
//!   recipes; weights quantized every step (no micro-batch cache). TFLOP/s counts the six GEMMs.
//! * `mlp_pass`: each norm / activation pass alone on the same shapes (forward with the fused
//!   amax, backward with amax and dbias), to say how much of a step they take.
//! Timing: the GPU time of N back-to-back calls between two timing events on CubeCL's stream
//! (`common/timing.rs`), best of three runs; the steps of one activation in rounds (one run of each recipe per round, after a
//! round that heats the GPU: `timing::time_rounds`), and with `LOWP_BENCH_TURNS=1` PyTorch's
//! step runs before each round (`benches/layernorm_mlp_torch.py --turns`). `LOWP_BENCH_FILTER=text` keeps only the cases whose name contains `text`;
//! `LOWP_BENCH_PROFILE_STEPS=n` runs n untimed steps of each selected recipe (for a tracer).

#[path = "common/cases.rs"]
mod cases;
#[path = "common/timing.rs"]
mod timing;
use cases::{fp8_encoder_from_env, recipe, selected};
use timing::{time, time_rounds};

use burn::backend::Autodiff;
use burn::tensor::{Distribution, Tensor};
use burn_cubecl::CubeBackend;
use burn_lowp::backend::{ActivationOps, NormOps, NormSpec, QuantizeOps};
use burn_lowp::format::{Fp8CurrentScaling, Fp8Format, FormatConfig, Usage};
use burn_lowp::nn::LayerNormMlpConfig;
use burn_lowp::ops::{Activation, ActivationParams, ActivationSpec};
use burn_lowp_kernels::cubecl::cuda::{CudaDevice, CudaRuntime};
use burn_lowp_kernels::cubecl::prelude::*;

type B = CubeBackend<CudaRuntime, half::bf16, i32, u8>;
type AD = Autodiff<B>;

fn main() {
    if !burn_lowp::backend::device::cuda_available() {
        eprintln!("layernorm_mlp bench: no CUDA device, nothing to measure");
        return;
    }
    let device = CudaDevice::new(0);
    let client = CudaRuntime::client(&device);
    let (tokens, hidden, ffn) = (8192usize, 4096usize, 16384usize);
    let x_inner = Tensor::<B, 2>::random([tokens, hidden], Distribution::Normal(0.0, 1.0), &device);
    let x = Tensor::<AD, 2>::from_inner(x_inner.clone()).require_grad();

    let encoder = fp8_encoder_from_env();
    for act in [Activation::Gelu, Activation::Swiglu] {
        let width = if act.is_gated() { 2 * ffn } else { ffn };
        // The passes alone.
        let spec = ActivationSpec {
            activation: act,
            params: ActivationParams::default(),
        };
        let h = Tensor::<B, 2>::random([tokens, width], Distribution::Normal(0.0, 1.0), &device);
        let da = Tensor::<B, 2>::random([tokens, ffn], Distribution::Normal(0.0, 1.0), &device);
        let gamma = Tensor::<B, 1>::ones([hidden], &device);
        let beta = Tensor::<B, 1>::zeros([hidden], &device);
        let norm = NormSpec {
            rms: false,
            eps: 1e-5,
            zero_centered_gamma: false,
        };
        let fwd = B::norm_forward(
            x_inner.clone().into_primitive().tensor(),
            gamma.clone().into_primitive().tensor(),
            Some(beta.clone().into_primitive().tensor()),
            &norm,
            true,
        )
        .expect("norm");
        let (mean, rstd) = (fwd.mean.clone(), fwd.rstd.clone());
        let current = FormatConfig::Fp8Current(Fp8CurrentScaling::new(Fp8Format::E4M3));
        let passes: Vec<(&str, usize, Box<dyn Fn()>)> = vec![
            (
                "norm_forward",
                2 * tokens * hidden * 2,
                Box::new(|| {
                    B::norm_forward(
                        x_inner.clone().into_primitive().tensor(),
                        gamma.clone().into_primitive().tensor(),
                        Some(beta.clone().into_primitive().tensor()),
                        &norm,
                        true,
                    )
                    .expect("norm");
                }),
            ),
            (
                "activation_forward",
                2 * tokens * (width + ffn),
                Box::new(|| {
                    B::act_forward(h.clone().into_primitive().tensor(), &spec, true)
                        .expect("activation");
                }),
            ),
            (
                // fc2's input under current scaling, both directions, as the module makes it: an
                // amax pass over the activation and the cast applying it (bytes: h read once,
                // the codes written)...
                "activation_cast_current",
                2 * tokens * width + 2 * tokens * ffn,
                Box::new(|| {
                    B::act_quantize_fp8_current(
                        h.clone().into_primitive().tensor(),
                        &spec,
                        &current,
                        Usage::BOTH,
                    )
                    .expect("fused activation cast")
                    .expect("CUDA fuses the activation cast");
                }),
            ),
            (
                // ... and the unfused pair it replaced: the activation stored with its amax, then
                // the cast from that amax.
                "activation_then_cast_current",
                2 * tokens * width + 2 * tokens * ffn,
                Box::new(|| {
                    let act = B::act_forward(h.clone().into_primitive().tensor(), &spec, true)
                        .expect("activation");
                    B::quantize_fp8_current_with_amax(act.y, &current, &act.amax.expect("fused amax"), Usage::BOTH)
                        .expect("cast");
                }),
            ),
            (
                "activation_backward",
                2 * tokens * (2 * width + ffn),
                Box::new(|| {
                    B::act_backward(
                        da.clone().into_primitive().tensor(),
                        h.clone().into_primitive().tensor(),
                        &spec,
                        true,
                        true,
                    )
                    .expect("activation backward");
                }),
            ),
            (
                "norm_backward",
                2 * tokens * hidden * 3,
                Box::new(|| {
                    B::norm_backward(
                        x_inner.clone().into_primitive().tensor(),
                        x_inner.clone().into_primitive().tensor(),
                        gamma.clone().into_primitive().tensor(),
                        mean.clone(),
                        rstd.clone(),
                        &norm,
                        true,
                    )
                    .expect("norm backward");
                }),
            ),
        ];
        for (pass, bytes, f) in &passes {
            if !selected(&format!("mlp_pass {act} {pass}")) {
                continue;
            }
            let seconds = time(&client, 50, 3, f);
            println!(
                "{{\"bench\":\"mlp_pass\",\"activation\":\"{act}\",\"pass\":\"{pass}\",\"time_us\":{:.1},\"gb_per_s\":{:.0}}}",
                seconds * 1e6,
                *bytes as f64 / seconds / 1e9
            );
        }

        // Every recipe's module first, warmed up (a failing recipe reports itself and the others
        // still run); then the steps are timed in rounds, one run of each recipe per round
        // (`time_rounds`), so that the recipes compared meet the GPU in the same state.
        let mut modules = Vec::new();
        for name in [
            "bf16",
            "current_scaling",
            "current_scaling_fast_accumulation",
            "delayed_scaling",
            "block_scaling",
            "mxfp8",
        ] {
            if !selected(&format!("mlp_step {act} {name}")) {
                continue;
            }
            let module = LayerNormMlpConfig::new(hidden, ffn)
                .with_activation(act)
                .with_name("mlp".into())
                .init::<AD>(&recipe(&format!("{name}.json")), &device)
                .expect("layernorm_mlp");
            let warm = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                for _ in 0..3 {
                    mlp_step(&module, &x);
                }
            }));
            match warm {
                Ok(()) => modules.push((name, module)),
                Err(_) => println!(
                    "{{\"bench\":\"mlp_step\",\"activation\":\"{act}\",\"recipe\":\"{name}\",\"error\":\"panicked\"}}"
                ),
            }
        }
        if let Some(steps) = cases::profile_steps() {
            for (_, module) in &modules {
                for _ in 0..steps {
                    mlp_step(module, &x);
                }
                timing::sync(&client);
            }
            continue;
        }
        let mut steps: Vec<Box<dyn FnMut() + '_>> = modules
            .iter()
            .map(|(_, module)| Box::new(|| mlp_step(module, &x)) as Box<dyn FnMut() + '_>)
            .collect();
        let peer_case = serde_json::json!({ "bench": "mlp_step", "activation": act.to_string() });
        let seconds = time_rounds(&client, &peer_case, 10, 3, &mut steps);
        drop(steps);
        for ((name, _), seconds) in modules.iter().zip(seconds) {
            let flops = 3.0 * 2.0 * (tokens * hidden * (width + ffn)) as f64;
            println!(
                "{{\"bench\":\"mlp_step\",\"activation\":\"{act}\",\"recipe\":\"{name}\",\"encoder\":\"{encoder}\",\"tokens\":{tokens},\"hidden\":{hidden},\"ffn\":{ffn},\"time_us\":{:.1},\"tflops\":{:.1}}}",
                seconds * 1e6,
                flops / seconds / 1e12
            );
        }
    }
}

/// One training step of the block: forward, backward (input and every parameter), end of step.
fn mlp_step(module: &burn_lowp::nn::LayerNormMlp<AD>, x: &Tensor<AD, 2>) {
    let (y, _) = module.forward(x.clone()).expect("forward");
    let grads = y.backward();
    let _ = module.fc1_weight.grad(&grads);
    module.end_step().unwrap();
}
