//! Grouped (MoE experts) GEMM and `GroupedLinear` step throughput on CUDA, printed as JSON lines;
//! `benches/grouped_torch.py` is the PyTorch peer (`torch._grouped_mm`, `torch._scaled_grouped_mm`)
//! and reads these lines for the same splits, then prints the ratios.
//!
//! `cargo bench --features cuda --bench grouped`:
//! * `grouped_gemm`: fprop `Y_g = X_g·W_gᵀ`, dgrad `dX_g = dY_g·W_g` and wgrad `dW_g = dY_gᵀ·X_g`
//!   on pre-quantized operands (BF16 output) for three MoE shapes (E, T, K, N), balanced
//!   and skewed splits (lognormal sizes, some experts empty), BF16, FP8 per-tensor (E4M3 both
//!   sides, as `torch._scaled_grouped_mm`; `fp8_tensor_shared`: one scale shared by the experts,
//!   applied by cuBLASLt, no per-expert pass) and FP8 block (1x128 activations x 128x128 weights).
//!   The splits live on the device; the operands are in the aligned layout. TFLOP/s counts useful
//!   work, 2·T·N·K. fprop and dgrad run twice: with the splits' host copy arrived
//!   (`splits_on_host`: the pointer array's `batch: exact`, the chunks the groups fill, or one GEMM
//!   per group where `backend::per_group_pays`), and before it has (`batch: bound`, the
//!   host-known bound of chunks; by default our Hopper grouped GEMM runs there instead where it
//!   supports the GEMM, counted as `device_grouped_batches`, and `LOWP_GROUPED_KERNEL=cublaslt`
//!   keeps cuBLASLt's batch).
//!   FP8 per-tensor dgrad runs with TE's split accumulator and, as the PyTorch peer does, with fast
//!   accumulation (`accumulation`).
//! * `grouped_linear_step`: `GroupedLinear` (E = 8, 2048 -> 2048, 32768 tokens, BF16 parameters and
//!   activations) forward + backward per recipe (FP8 per-tensor ones also with the experts
//!   sharing one scale, `_shared`), including the layout, the row moves, every
//!   quantization, and the host synchronizations per step (`host_syncs`); `bf16` and
//!   `current_scaling_shared` also with the splits' copy taken by the resolver thread
//!   (`_background`, `LOWP_SPLIT_COPY=background`), and with it taken only by its first reader
//!   (`_read_only`, `LOWP_SPLIT_COPY=read-only`) rather than also once the stream mark says it
//!   has arrived (the default); and `_padded_copy`: the token rows padded into the aligned
//!   layout by a row gather before `forward_aligned` (the module's path before its FP8 cast read
//!   the packed rows through the layout's row map).
//! Timing as `benches/gemm.rs` (best of three runs, GPU time between timing events); with
//! `LOWP_BENCH_TURNS=1` each run waits for its PyTorch peer's run of the same case
//! (`benches/turns.py` drives both: `timing::time_in_turns`).
//! `LOWP_BENCH_FILTER=text` keeps only the cases whose name contains `text`.

#[path = "common/cases.rs"]
mod cases;
#[path = "common/timing.rs"]
mod timing;
use cases::{recipe, selected};
use timing::{sync, time_in_turns};

use burn::backend::Autodiff;
use burn::tensor::{Distribution, FloatDType, Int, Tensor, TensorData, TensorPrimitive};
use burn_cubecl::CubeBackend;
use burn_lowp::backend::{
    host_syncs, GemmKind, GemmOptions, GroupLayout, GroupedGemmPath, GroupedOperand, GroupedOps,
    Groups,
};
use burn_lowp::format::fp8_block::BlockShape;
use burn_lowp::format::grouped::{uniform_groups, GroupScaling};
use burn_lowp::format::{Fp8Format, Usage};
use burn_lowp::nn::GroupedLinearConfig;
use burn_lowp::ops::{LowpLinear, RowMove};
use burn_lowp::quant::grouped::quantize_grouped;
use burn_lowp::quant::{IdentityDtype, QuantizedTensor, QuantizerSpec};
use burn_lowp_kernels::cubecl::cuda::{CudaDevice, CudaRuntime};
use burn_lowp_kernels::cubecl::prelude::*;
use serde_json::json;

type B = CubeBackend<CudaRuntime, half::bf16, i32, u8>;

/// splitmix64: a deterministic stream for the skewed splits.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn uniform(&mut self) -> f64 {
        ((self.next() >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    }

    fn normal(&mut self) -> f64 {
        (-2.0 * self.uniform().ln()).sqrt() * (2.0 * std::f64::consts::PI * self.uniform()).cos()
    }
}

/// Balanced: T/E each. Skewed: lognormal(0, 1) shares, max(1, E/16) experts empty, the rest of
/// the rounding to the largest expert.
fn make_splits(experts: usize, tokens: usize, skewed: bool) -> Vec<i64> {
    if !skewed {
        let mut s = vec![(tokens / experts) as i64; experts];
        s[experts - 1] += (tokens - tokens / experts * experts) as i64;
        return s;
    }
    let mut rng = Rng(experts as u64 * 1_000_003 + tokens as u64);
    let mut w: Vec<f64> = (0..experts).map(|_| rng.normal().exp()).collect();
    for _ in 0..(experts / 16).max(1) {
        let e = (rng.next() % experts as u64) as usize;
        w[e] = 0.0;
    }
    let total: f64 = w.iter().sum();
    let mut s: Vec<i64> = w
        .iter()
        .map(|v| (v / total * tokens as f64).floor() as i64)
        .collect();
    let largest = (0..experts).max_by_key(|&e| s[e]).unwrap();
    s[largest] += tokens as i64 - s.iter().sum::<i64>();
    s
}

fn quantized(
    t: Tensor<B, 2>,
    groups: &Groups<B>,
    spec: &QuantizerSpec,
    usage: Usage,
    scaling: GroupScaling,
) -> QuantizedTensor<B> {
    quantize_grouped::<B>(t.into_primitive().tensor(), groups, spec, usage, 0, None, scaling)
        .expect("grouped quantize")
}

fn grouped_gemms(device: &CudaDevice, client: &ComputeClient<CudaRuntime>) {
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
    let per_group = GroupScaling::PerGroup;
    let formats: Vec<(&str, QuantizerSpec, QuantizerSpec, GroupScaling)> = vec![
        ("bf16", bf16.clone(), bf16, per_group),
        ("fp8_tensor", fp8.clone(), fp8.clone(), per_group),
        ("fp8_tensor_shared", fp8.clone(), fp8, GroupScaling::Shared),
        (
            "fp8_block",
            block(BlockShape::OneByOneTwentyEight),
            block(BlockShape::OneTwentyEightSquare),
            per_group,
        ),
    ];
    let both = Usage {
        rowwise: true,
        columnwise: true,
    };
    for (experts, tokens, k, n) in [
        (8usize, 32768usize, 7168usize, 2048usize),
        (16, 32768, 2048, 768),
        (128, 65536, 2048, 1536),
    ] {
        for dist in ["balanced", "skewed"] {
            let splits = make_splits(experts, tokens, dist == "skewed");
            let m_splits = Tensor::<B, 1, Int>::from_data(
                TensorData::new(splits.clone(), [experts]),
                device,
            );
            let layout: GroupLayout<B> =
                B::grouped_layout(m_splits.into_primitive(), tokens).expect("layout");
            // The splits' host copy arrives (the pointer array then runs the chunks they fill);
            // `unknown` is the same groups before it has (the host-known bound of chunks).
            layout.check().expect("splits");
            let unknown = Groups::<B> {
                host: layout.groups.host.unresolved(),
                ..layout.groups.clone()
            };
            let rows = layout.rows();
            let weight_groups =
                Groups::<B>::from_host(uniform_groups(experts, n), experts * n, device)
                    .expect("weight groups");
            // Padding rows are zero in the aligned layout; random rows there cost the same.
            let x = Tensor::<B, 2>::random([rows, k], Distribution::Normal(0.0, 1.0), device);
            let dy = Tensor::<B, 2>::random([rows, n], Distribution::Normal(0.0, 1.0), device);
            let w =
                Tensor::<B, 2>::random([experts * n, k], Distribution::Normal(0.0, 1.0), device);
            let flops = 2.0 * (tokens * n * k) as f64;
            for (format, act, wspec, scaling) in &formats {
                let case = format!("grouped_gemm {format} {experts}x{tokens}x{k}x{n} {dist}");
                if !selected(&case) {
                    continue;
                }
                let qx = quantized(x.clone(), &layout.groups, act, both, *scaling);
                let qdy = quantized(dy.clone(), &layout.groups, act, both, *scaling);
                let qw = quantized(w.clone(), &weight_groups, wspec, both, *scaling);
                let wop = GroupedOperand {
                    tensor: &qw,
                    groups: &weight_groups,
                };
                let fp8_tensor = format.starts_with("fp8_tensor");
                for (kind, batch, groups, split) in [
                    (GemmKind::Fprop, "exact", &layout.groups, None),
                    (GemmKind::Fprop, "bound", &unknown, None),
                    (GemmKind::Dgrad, "exact", &layout.groups, None),
                    (GemmKind::Dgrad, "bound", &unknown, None),
                    // FP8 dgrad also with fast accumulation (the PyTorch peer's numerics).
                    (GemmKind::Dgrad, "exact", &layout.groups, Some(false)),
                    (GemmKind::Wgrad, "exact", &layout.groups, None),
                ] {
                    if split.is_some() && !fp8_tensor {
                        continue;
                    }
                    let op = |t| GroupedOperand { tensor: t, groups };
                    let (a, b) = match kind {
                        GemmKind::Fprop => (op(&qx), wop),
                        GemmKind::Dgrad => (op(&qdy), wop),
                        GemmKind::Wgrad => (op(&qdy), op(&qx)),
                    };
                    let options = || GemmOptions::<B> {
                        out_dtype: FloatDType::BF16,
                        accumulate: None,
                        split_accumulator: split,
                        bias: None,
                    };
                    let accumulation = fp8_tensor.then(|| {
                        if kind.split_accumulator(split) { "split" } else { "fast" }
                    });
                    let path = B::grouped_gemm_path(kind, a, b);
                    let pointer_array = matches!(path, GroupedGemmPath::PointerArray(_));
                    if batch == "bound" && !pointer_array {
                        continue;
                    }
                    let mut line = json!({
                        "bench": "grouped_gemm", "format": format, "gemm": format!("{kind:?}").to_lowercase(),
                        "experts": experts, "tokens": tokens, "k": k, "n": n, "dist": dist,
                        "splits": splits, "path": format!("{path:?}"),
                        "batch": if pointer_array { json!(batch) } else { json!(null) },
                        "splits_on_host": batch == "exact",
                        "accumulation": accumulation,
                    });
                    if let Err(e) = B::grouped_gemm(kind, a, b, options()) {
                        line["error"] = json!(e.to_string());
                        println!("{line}");
                        continue;
                    }
                    let before = host_syncs();
                    let iterations = (2e14 / flops).clamp(5.0, 100.0) as usize;
                    let seconds = time_in_turns(client, &line, iterations, 3, || {
                        let _ = B::grouped_gemm(kind, a, b, options()).expect("grouped gemm");
                    });
                    let syncs = host_syncs().since(&before);
                    line["time_us"] = json!((seconds * 1e6 * 10.0).round() / 10.0);
                    line["tflops"] = json!((flops / seconds / 1e12 * 10.0).round() / 10.0);
                    line["split_reads"] = json!(syncs.split_reads);
                    line["exact_batches"] = json!(syncs.exact_batches);
                    line["bound_batches"] = json!(syncs.bound_batches);
                    line["device_grouped_batches"] = json!(syncs.device_grouped_batches);
                    line["blocking_syncs"] = json!(syncs.blocking());
                    println!("{line}");
                }
            }
        }
    }
}

fn grouped_linear_steps(device: &CudaDevice, client: &ComputeClient<CudaRuntime>) {
    type AD = Autodiff<B>;
    let (experts, tokens, features) = (8usize, 32768usize, 2048usize);
    for dist in ["balanced", "skewed"] {
        let splits = make_splits(experts, tokens, dist == "skewed");
        let m_splits =
            Tensor::<AD, 1, Int>::from_data(TensorData::new(splits.clone(), [experts]), device);
        let x = Tensor::<AD, 2>::from_inner(Tensor::<B, 2>::random(
            [tokens, features],
            Distribution::Normal(0.0, 1.0),
            device,
        ))
        .require_grad();
        use burn_lowp::backend::host_copy::{set_split_copy, SplitCopy};
        let on_read = SplitCopy::OnRead;
        for (name, file, scaling, split_copy, padded_copy) in [
            ("bf16", "bf16", GroupScaling::PerGroup, on_read, false),
            ("current_scaling", "current_scaling", GroupScaling::PerGroup, on_read, false),
            ("current_scaling_shared", "current_scaling", GroupScaling::Shared, on_read, false),
            ("delayed_scaling", "delayed_scaling", GroupScaling::PerGroup, on_read, false),
            ("delayed_scaling_shared", "delayed_scaling", GroupScaling::Shared, on_read, false),
            ("block_scaling", "block_scaling", GroupScaling::PerGroup, on_read, false),
            ("mxfp8", "mxfp8", GroupScaling::PerGroup, on_read, false),
            // The splits' copy taken by the resolver thread as soon as it arrives: exact batches.
            ("bf16_background", "bf16", GroupScaling::PerGroup, SplitCopy::Background, false),
            ("current_scaling_shared_background", "current_scaling", GroupScaling::Shared, SplitCopy::Background, false),
            // Taken only by its first reader (no stream mark): fprop and dgrad never see it.
            ("bf16_read_only", "bf16", GroupScaling::PerGroup, SplitCopy::ReadOnly, false),
            ("current_scaling_read_only", "current_scaling", GroupScaling::PerGroup, SplitCopy::ReadOnly, false),
            ("current_scaling_shared_read_only", "current_scaling", GroupScaling::Shared, SplitCopy::ReadOnly, false),
            // The token rows padded into the aligned layout by a row gather first (a padded copy
            // in memory), as the module did before its FP8 cast read the packed rows itself.
            ("bf16_padded_copy", "bf16", GroupScaling::PerGroup, on_read, true),
            ("current_scaling_padded_copy", "current_scaling", GroupScaling::PerGroup, on_read, true),
            ("current_scaling_shared_padded_copy", "current_scaling", GroupScaling::Shared, on_read, true),
        ] {
            let case = format!("grouped_linear_step {name} {dist}");
            if !selected(&case) {
                continue;
            }
            set_split_copy(split_copy);
            let module = GroupedLinearConfig::new(experts, features, features)
                .with_fp8_scales(scaling)
                .init::<AD>(&recipe(&format!("{file}.json")), device)
                .expect("grouped linear");
            fn move_rows(
                t: Tensor<Autodiff<B>, 2>,
                layout: &GroupLayout<B>,
                direction: RowMove,
            ) -> Tensor<Autodiff<B>, 2> {
                Tensor::from_primitive(TensorPrimitive::Float(
                    <Autodiff<B> as LowpLinear>::lowp_move_rows(t.into_primitive().tensor(), layout, direction),
                ))
            }
            let step = || {
                let y = if padded_copy {
                    let layout = module.layout(m_splits.clone(), tokens).expect("layout");
                    let aligned = move_rows(x.clone(), &layout, RowMove::Pad);
                    let y = module.forward_aligned(aligned, &layout, None).expect("forward");
                    move_rows(y, &layout, RowMove::Unpad)
                } else {
                    module.forward(x.clone(), m_splits.clone()).expect("forward")
                };
                let grads = y.backward();
                let _ = module.weight.grad(&grads);
                module.end_step().unwrap();
            };
            let mut line = json!({
                "bench": "grouped_linear_step", "recipe": name, "experts": experts,
                "tokens": tokens, "in": features, "out": features, "dist": dist, "splits": splits,
            });
            let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                let seconds = time_in_turns(client, &line, 10, 3, step);
                sync(client);
                let before = host_syncs();
                let steps = 10;
                for _ in 0..steps {
                    step();
                }
                sync(client);
                (seconds, host_syncs().since(&before), steps)
            }));
            match result {
                Ok((seconds, syncs, steps)) => {
                    let flops = 3.0 * 2.0 * (tokens * features * features) as f64;
                    line["time_us"] = json!((seconds * 1e6 * 10.0).round() / 10.0);
                    line["tflops"] = json!((flops / seconds / 1e12 * 10.0).round() / 10.0);
                    line["split_reads_per_step"] = json!(syncs.split_reads as f64 / steps as f64);
                    line["exact_batches_per_step"] = json!(syncs.exact_batches as f64 / steps as f64);
                    line["bound_batches_per_step"] = json!(syncs.bound_batches as f64 / steps as f64);
                    line["device_grouped_batches_per_step"] =
                        json!(syncs.device_grouped_batches as f64 / steps as f64);
                    line["blocking_syncs_per_step"] =
                        json!(syncs.blocking() as f64 / steps as f64);
                    line["split_wait_us_per_step"] =
                        json!(syncs.split_wait_us as f64 / steps as f64);
                }
                Err(_) => line["error"] = json!("panicked"),
            }
            println!("{line}");
        }
        set_split_copy(SplitCopy::OnRead);
    }
}

fn main() {
    if !burn_lowp::backend::device::cuda_available() {
        eprintln!("grouped bench: no CUDA device, nothing to measure");
        return;
    }
    let device = CudaDevice::new(0);
    let client = CudaRuntime::client(&device);
    grouped_gemms(&device, &client);
    grouped_linear_steps(&device, &client);
}
