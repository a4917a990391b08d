//! GEMM and Linear-step throughput on CUDA, printed as JSON lines (`benches/gemm_torch.py` is the
//! PyTorch peer and joins both into ratios).
//!
//! `cargo bench --features cuda --bench gemm`:
//! * `gemm`: fprop `Y[M,N] = X[M,K]·W[N,K]ᵀ` on pre-quantized operands, BF16 output, for BF16
//!   (cuBLASLt BF16), FP8 per-tensor (E4M3 x E4M3, fast accumulation) and FP8 block (1x128 x
//!   128x128) on 4096³, 8192³ and 16384x8192x8192, each with the three stream orderings
//!   (`cubecl_stream`, the default, `device_flags` and `host_sync`); TFLOP/s = 2·M·N·K / time.
//!   Each also gets `host_us` (host time per call: the enqueue loop before the device sync) and,
//!   for the two that do not wait, a `gemm_phases` line splitting that host time by phase
//!   (`GemmPhase`).
//!   The shapes include 1024³, 2048³ and the MoE example's projection and expert shapes.
//! * `burn_matmul`: Burn's own BF16 matmul (CubeCL, no ordering handshake) on the same shapes.
//! * `handshake`: the ordering handshake alone (a group of no GEMMs), GPU+host and host time,
//!   per ordering that does not wait.
//! * `gemm_raw`: the same BF16 GEMMs enqueued straight on our cuBLASLt stream, no CubeCL ordering
//!   at all, and small shapes where a per-GEMM overhead shows: the interop cost is the difference.
//! * `linear_step`: `Linear` (8192 -> 8192, bias, BF16 parameters and activations) forward +
//!   backward on 8192 tokens under the bf16, current_scaling (and its fast-accumulation
//!   variant), delayed_scaling and block_scaling recipes, weight quantized every step (no
//!   micro-batch cache), quantization included.
//! Timing: the GPU time of N back-to-back calls between two timing events on CubeCL's stream
//! (`common/timing.rs`; `LOWP_BENCH_CLOCK=wall` for the wall clock), best of three runs; under
//! `benches/gemm_torch.py --turns` the `gemm` cases on CubeCL's stream and the `linear_step`
//! cases take turns with the peer run by run (`benches/turns.py` says why);
//! `gemm_raw` times its calls on our stream by the wall clock. `LOWP_BENCH_FILTER=text` keeps
//! only the cases whose name contains `text`.

use std::time::Instant;

#[path = "common/cases.rs"]
mod cases;
#[path = "common/timing.rs"]
mod timing;
use cases::{fp8_encoder_from_env, recipe, selected};
use timing::{host_time, sync, time, time_in_turns};

use burn::backend::Autodiff;
use burn::tensor::{Distribution, Tensor};
use burn_cubecl::CubeBackend;
use burn_lowp::backend::cuda::cublaslt::{
    run_group_on_cubecl_buffers, set_stream_ordering, CublasLt, LtGemm, LtOperand, StreamOrdering,
};
use burn_lowp::backend::{gemm_profile, set_gemm_profiling, GemmKind, GemmOptions, GemmOps};
use burn_lowp::format::fp8_block::BlockShape;
use burn_lowp::format::{Fp8Format, Usage};
use burn_lowp::nn::LinearConfig;
use burn_lowp::quant::{quantize, IdentityDtype, QuantizeCall, QuantizedTensor, QuantizerSpec};
use burn_lowp_kernels::cubecl::cuda::{CudaDevice, CudaRuntime};
use burn_lowp_kernels::cubecl::prelude::*;
use cudarc::cublaslt::sys::cudaDataType_t as DataType;

type B = CubeBackend<CudaRuntime, half::bf16, i32, u8>;

fn quantized(x: &Tensor<B, 2>, spec: &QuantizerSpec) -> QuantizedTensor<B> {
    quantize::<B>(
        x.clone().into_primitive().tensor(),
        spec,
        Usage::ROWWISE,
        false,
        &QuantizeCall::new(0),
    )
    .expect("quantize")
}

fn main() {
    if !burn_lowp::backend::device::cuda_available() {
        eprintln!("gemm bench: no CUDA device, nothing to measure");
        return;
    }
    let device = CudaDevice::new(0);
    let client = CudaRuntime::client(&device);
    let fp8 = QuantizerSpec::Fp8Current {
        fp8: Fp8Format::E4M3,
        pow2_scales: false,
        amax_epsilon: 0.0,
    };
    let block = |block| QuantizerSpec::Fp8Block {
        fp8: Fp8Format::E4M3,
        block,
        pow2_scales: true,
        amax_epsilon: 0.0,
    };
    let bf16 = QuantizerSpec::Identity {
        dtype: IdentityDtype::Bf16,
    };
    let formats: Vec<(&str, QuantizerSpec, QuantizerSpec)> = vec![
        ("bf16", bf16.clone(), bf16.clone()),
        ("fp8_tensor", fp8.clone(), fp8.clone()),
        (
            "fp8_block",
            block(BlockShape::OneByOneTwentyEight),
            block(BlockShape::OneTwentyEightSquare),
        ),
    ];
    let options = || GemmOptions::<B> {
        out_dtype: burn::tensor::FloatDType::BF16,
        accumulate: None,
        split_accumulator: None,
        bias: None,
    };
    // Square shapes, then the MoE example's (configs/moe-235m.json: 4096 tokens per micro-batch,
    // hidden 1024): QKV and attention-out projections, and an expert's fc1 (SwiGLU, 2048 wide)
    // and fc2 at its ~1024 routed tokens.
    let shapes = [
        (1024usize, 1024usize, 1024usize),
        (2048, 2048, 2048),
        (4096, 4096, 4096),
        (8192, 8192, 8192),
        (16384, 8192, 8192),
        (4096, 3072, 1024),
        (4096, 1024, 1024),
        (1024, 2048, 1024),
    ];
    report_handshake(&client);
    for (m, n, k) in shapes {
        let x = Tensor::<B, 2>::random([m, k], Distribution::Normal(0.0, 1.0), &device);
        let w = Tensor::<B, 2>::random([n, k], Distribution::Normal(0.0, 1.0), &device);
        let flops = 2.0 * (m * n * k) as f64;
        let iterations = (1e14 / flops).clamp(20.0, 400.0) as usize;
        for (name, xs, ws) in &formats {
            if !selected(&format!("gemm {name} {m}x{n}x{k}")) {
                continue;
            }
            let (qx, qw) = (quantized(&x, xs), quantized(&w, ws));
            let path = B::gemm_path(GemmKind::Fprop, &qx, &qw);
            if let Err(e) = B::gemm_quantized(GemmKind::Fprop, &qx, &qw, options()) {
                println!(
                    "{{\"bench\":\"gemm\",\"format\":\"{name}\",\"m\":{m},\"n\":{n},\"k\":{k},\"error\":{:?}}}",
                    e.to_string()
                );
                continue;
            }
            for (ordering_name, ordering) in [
                ("cubecl_stream", StreamOrdering::CubeclStream),
                ("device_flags", StreamOrdering::DeviceFlags),
                ("host_sync", StreamOrdering::HostSync),
            ] {
                set_stream_ordering(ordering);
                let call = || {
                    let _ = B::gemm_quantized(GemmKind::Fprop, &qx, &qw, options()).expect("gemm");
                };
                // The default ordering takes turns with the peer (`gemm_torch.py --turns`).
                let seconds = if ordering == StreamOrdering::CubeclStream {
                    let case = serde_json::json!({ "bench": "gemm", "format": name, "m": m, "n": n, "k": k });
                    time_in_turns(&client, &case, iterations, 3, call)
                } else {
                    time(&client, iterations, 3, call)
                };
                let host = host_time(&client, iterations, call);
                println!(
                    "{{\"bench\":\"gemm\",\"format\":\"{name}\",\"path\":\"{path:?}\",\"ordering\":\"{ordering_name}\",\"m\":{m},\"n\":{n},\"k\":{k},\"time_us\":{:.1},\"host_us\":{:.1},\"tflops\":{:.1}}}",
                    seconds * 1e6,
                    host * 1e6,
                    flops / seconds / 1e12
                );
                if ordering != StreamOrdering::HostSync {
                    report_phases(
                        &client,
                        &format!("gemm {name} {m}x{n}x{k} {ordering_name}"),
                        iterations,
                        call,
                    );
                }
            }
            set_stream_ordering(StreamOrdering::CubeclStream);
        }
        // Burn's own matmul (CubeCL, on CubeCL's stream, no ordering handshake), BF16.
        if selected(&format!("burn_matmul bf16 {m}x{n}x{k}")) {
            let wt = w.clone().transpose();
            let call = || {
                let _ = x.clone().matmul(wt.clone());
            };
            let seconds = time(&client, iterations, 3, call);
            println!(
                "{{\"bench\":\"burn_matmul\",\"format\":\"bf16\",\"m\":{m},\"n\":{n},\"k\":{k},\"time_us\":{:.1},\"tflops\":{:.1}}}",
                seconds * 1e6,
                flops / seconds / 1e12
            );
        }
        // The same BF16 GEMM straight on our stream: no ordering against CubeCL at all.
        if !selected(&format!("gemm_raw bf16 {m}x{n}x{k}")) {
            continue;
        }
        let (xb, wb, out) = (
            x.clone().into_primitive().tensor(),
            w.clone().into_primitive().tensor(),
            client.empty(m * n * 2),
        );
        let pins: Vec<_> = [&xb.handle, &wb.handle, &out]
            .iter()
            .map(|h| client.get_resource((*h).clone()).expect("pin"))
            .collect();
        sync(&client);
        let ptr: Vec<u64> = pins.iter().map(|p| p.resource().ptr).collect();
        let gemm = LtGemm {
            m: n as u64,
            n: m as u64,
            k: k as u64,
            a: LtOperand {
                ptr: ptr[1],
                dtype: DataType::CUDA_R_16BF,
                transpose: true,
                ld: k as i64,
                scale: None,
            },
            b: LtOperand {
                ptr: ptr[0],
                dtype: DataType::CUDA_R_16BF,
                transpose: false,
                ld: k as i64,
                scale: None,
            },
            c: None,
            d: ptr[2],
            d_dtype: DataType::CUDA_R_16BF,
            bias: None,
            fast_accum: false,
            batch: None,
            strided: None,
            autotune: true,
        };
        let raw = |count: usize| {
            CublasLt::with(0, |lt| {
                for _ in 0..count {
                    unsafe { lt.enqueue(&gemm)? };
                }
                lt.synchronize()
            })
            .expect("raw cuBLASLt")
        };
        raw(3);
        let seconds = (0..3)
            .map(|_| {
                let start = Instant::now();
                raw(iterations);
                start.elapsed().as_secs_f64() / iterations as f64
            })
            .fold(f64::INFINITY, f64::min);
        println!(
            "{{\"bench\":\"gemm_raw\",\"format\":\"bf16\",\"m\":{m},\"n\":{n},\"k\":{k},\"time_us\":{:.1},\"tflops\":{:.1}}}",
            seconds * 1e6,
            flops / seconds / 1e12
        );
        drop(pins);
    }

    // Linear forward + backward, 8192 tokens, 8192 -> 8192.
    type AD = Autodiff<B>;
    let (tokens, features) = (8192usize, 8192usize);
    let x = Tensor::<AD, 2>::from_inner(Tensor::<B, 2>::random(
        [tokens, features],
        Distribution::Normal(0.0, 1.0),
        &device,
    ))
    .require_grad();
    let encoder = fp8_encoder_from_env();
    for name in [
        "bf16",
        "current_scaling",
        "current_scaling_fast_accumulation",
        "delayed_scaling",
        "block_scaling",
    ] {
        if !selected(&format!("linear_step {name}")) {
            continue;
        }
        let linear = LinearConfig::new(features, features)
            .init::<AD>(&recipe(&format!("{name}.json")), &device)
            .expect("linear");
        let step = || {
            let y = linear.forward(x.clone()).expect("forward");
            let grads = y.backward();
            let _ = linear.weight.grad(&grads);
            linear.end_step().unwrap();
        };
        // `LOWP_BENCH_PROFILE_STEPS=n`: run n untimed steps only (under a profiler such as ncu).
        if let Some(steps) = cases::profile_steps() {
            for _ in 0..steps {
                step();
            }
            sync(&client);
            continue;
        }
        // A failing recipe reports itself and the others still run.
        let seconds = match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            time_in_turns(&client, &serde_json::json!({ "bench": "linear_step" }), 20, 3, step)
        })) {
            Ok(seconds) => seconds,
            Err(_) => {
                println!(
                    "{{\"bench\":\"linear_step\",\"recipe\":\"{name}\",\"error\":\"panicked\"}}"
                );
                continue;
            }
        };
        let flops = 3.0 * 2.0 * (tokens * features * features) as f64;
        println!(
            "{{\"bench\":\"linear_step\",\"recipe\":\"{name}\",\"encoder\":\"{encoder}\",\"tokens\":{tokens},\"in\":{features},\"out\":{features},\"time_us\":{:.1},\"tflops\":{:.1}}}",
            seconds * 1e6,
            flops / seconds / 1e12
        );
    }
}

/// One JSON line with the mean host microseconds of each phase of a call (`GemmPhase`).
fn report_phases(
    client: &ComputeClient<CudaRuntime>,
    case: &str,
    iterations: usize,
    f: impl FnMut(),
) {
    set_gemm_profiling(true);
    let _ = host_time(client, iterations, f);
    let phases: Vec<String> = gemm_profile()
        .iter()
        .map(|(phase, us, _)| format!("\"{}\":{us:.2}", phase.name()))
        .collect();
    set_gemm_profiling(false);
    println!(
        "{{\"bench\":\"gemm_phases\",\"case\":\"{case}\",\"host_us\":{{{}}}}}",
        phases.join(",")
    );
}

/// The ordering handshake alone: a group of no GEMMs through the same path (READY signal and
/// wait, DONE write and wait), time per call and host time per call.
fn report_handshake(client: &ComputeClient<CudaRuntime>) {
    if !selected("handshake") {
        return;
    }
    for (ordering_name, ordering) in [
        ("cubecl_stream", StreamOrdering::CubeclStream),
        ("device_flags", StreamOrdering::DeviceFlags),
    ] {
        set_stream_ordering(ordering);
        let call = || {
            run_group_on_cubecl_buffers(client, 0, &[], (), |_| Vec::new()).expect("handshake");
        };
        let seconds = time(client, 400, 3, call);
        let host = host_time(client, 400, call);
        println!(
            "{{\"bench\":\"handshake\",\"ordering\":\"{ordering_name}\",\"time_us\":{:.2},\"host_us\":{:.2}}}",
            seconds * 1e6,
            host * 1e6
        );
        report_phases(client, &format!("handshake {ordering_name}"), 400, call);
    }
    set_stream_ordering(StreamOrdering::CubeclStream);
}
