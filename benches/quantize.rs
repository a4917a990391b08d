//! Quantize kernel throughput on CUDA: every format x {rowwise, columnwise, both} on 16384x8192
//! and 4096x4096 bf16 inputs, against a plain device copy of the input measured in the same run.
//!
//! `cargo bench --features cuda --bench quantize` prints one JSON line per case:
//! `gbps` = (input bytes + output bytes) / time, `copy_gbps` = 2 * input bytes / copy time, and
//! their ratio. Current scaling and NVFP4 read the input twice (amax pass, then cast); their
//! bytes still count the input once, so the ratio shows the cost of the second pass.
//! `fp8-e4m3-scale` is the FP8 cast with a known scale (delayed scaling): one pass. FP8 formats run
//! with both encoders (`encoder`: CUDA's conversion instruction, then the integer encoder).
//! `LOWP_BENCH_FILTER=text` keeps the cases whose `format encoder usage` contains `text`.
//! Timing: the GPU time of N back-to-back calls between two timing events on CubeCL's stream
//! (`common/timing.rs`: idle time between the calls counts, what a run costs once does not);
//! `host_us` is what the CPU spends per call enqueueing (timing::host_time), for the formats'
//! cases.

#[path = "common/cases.rs"]
mod cases;
#[path = "common/timing.rs"]
mod timing;
use cases::selected;
use timing::{host_time, time};

use burn_cubecl::CubeBackend;
use burn_lowp::backend::{BytesOps, QuantizeOps};
use burn_lowp::format::fp8_block::BlockShape;
use burn_lowp::format::{
    FormatConfig, Fp8BlockScaling, Fp8CurrentScaling, Fp8Format, HostMatrix, InputDtype,
    Mxfp8Config, Nvfp4Config, Usage,
};
use burn_lowp_kernels::cubecl::cuda::{CudaDevice, CudaRuntime};
use burn_lowp_kernels::cubecl::prelude::*;

type Backend = CubeBackend<CudaRuntime, f32, i32, u8>;

/// Bytes a quantizer writes for `elements` values in one direction (codes + scales).
fn output_bytes(config: &FormatConfig, elements: usize) -> usize {
    match config {
        FormatConfig::Fp8Current(_) => elements,
        FormatConfig::Fp8Block(c) => {
            elements
                + match c.block {
                    BlockShape::OneByOneTwentyEight => elements / 128 * 4,
                    BlockShape::OneTwentyEightSquare => elements / (128 * 128) * 4,
                }
        }
        FormatConfig::Mxfp8(_) => elements + elements / 32,
        FormatConfig::Nvfp4(_) => elements / 2 + elements / 16,
    }
}

fn main() {
    if !burn_lowp::backend::device::cuda_available() {
        eprintln!("quantize bench: no CUDA device, nothing to measure");
        return;
    }
    let device = CudaDevice::new(0);
    let client = CudaRuntime::client(&device);
    let configs: Vec<(&str, FormatConfig)> = vec![
        (
            "fp8-e4m3-current",
            FormatConfig::Fp8Current(Fp8CurrentScaling::new(Fp8Format::E4M3)),
        ),
        (
            "fp8-block-1x128",
            FormatConfig::Fp8Block(Fp8BlockScaling::new(
                Fp8Format::E4M3,
                BlockShape::OneByOneTwentyEight,
            )),
        ),
        (
            "fp8-block-128x128",
            FormatConfig::Fp8Block(Fp8BlockScaling::new(
                Fp8Format::E4M3,
                BlockShape::OneTwentyEightSquare,
            )),
        ),
        (
            "mxfp8-e4m3",
            FormatConfig::Mxfp8(Mxfp8Config {
                fp8: Fp8Format::E4M3,
                block_2d: false,
            }),
        ),
        (
            "mxfp8-e4m3-2d",
            FormatConfig::Mxfp8(Mxfp8Config {
                fp8: Fp8Format::E4M3,
                block_2d: true,
            }),
        ),
        (
            "nvfp4",
            FormatConfig::Nvfp4(Nvfp4Config {
                block_2d: false,
                rht: false,
                stochastic_seed: None,
            }),
        ),
        (
            "nvfp4-2d",
            FormatConfig::Nvfp4(Nvfp4Config {
                block_2d: true,
                rht: false,
                stochastic_seed: None,
            }),
        ),
        (
            "nvfp4-rht",
            FormatConfig::Nvfp4(Nvfp4Config {
                block_2d: false,
                rht: true,
                stochastic_seed: None,
            }),
        ),
        (
            "nvfp4-rht-sr",
            FormatConfig::Nvfp4(Nvfp4Config {
                block_2d: false,
                rht: true,
                stochastic_seed: Some(7),
            }),
        ),
    ];
    let usages = [
        ("rowwise", Usage::ROWWISE),
        ("columnwise", Usage::COLUMNWISE),
        ("both", Usage::BOTH),
    ];
    for (rows, cols) in [(16384usize, 8192usize), (4096, 4096)] {
        let elements = rows * cols;
        let values: Vec<f32> = (0..elements)
            .map(|i| (((i as u64 * 2654435761) % 20011) as f32 / 20011.0 - 0.5) * 8.0)
            .collect();
        let x = HostMatrix::new(
            "x",
            rows,
            cols,
            InputDtype::BF16,
            values.iter().map(|&v| InputDtype::BF16.round(v)).collect(),
        )
        .unwrap();
        let input = Backend::bytes_float_from_host(&x, &device);
        let iterations = if elements > 50_000_000 { 20 } else { 100 };
        let input_bytes = elements * 2;
        let copy_seconds = time(&client, iterations, 1, || {
            let _ = burn_lowp_kernels::copy(&client, &input.handle, input_bytes);
        });
        let copy_gbps = 2.0 * input_bytes as f64 / copy_seconds / 1e9;
        println!("{{\"bench\":\"copy\",\"shape\":[{rows},{cols}],\"dtype\":\"bf16\",\"time_us\":{:.1},\"gbps\":{copy_gbps:.1}}}", copy_seconds * 1e6);
        // FP8 with a known scale (delayed scaling's cast): one pass over the input.
        let scale = Backend::bytes_float_from_host(
            &HostMatrix::new("scale", 1, 1, InputDtype::F32, vec![0.5]).unwrap(),
            &device,
        );
        // Each FP8 format twice: with the encoder this runtime uses (CUDA's conversion
        // instruction) and with the integer encoder (what every FP8 kernel ran before it).
        for (encoder, integer) in [("instruction", false), ("integer", true)] {
            burn_lowp_kernels::force_integer_fp8_encoder(integer);
            for (usage_name, usage) in usages {
                if !selected(&format!("fp8-e4m3-scale {encoder} {usage_name}")) {
                    continue;
                }
                let seconds = time(&client, iterations, 1, || {
                    let _ = Backend::quantize_fp8_with_scale(
                        input.clone(),
                        Fp8Format::E4M3,
                        burn_lowp::backend::ScaleColumns::whole(scale.clone()),
                        usage,
                        None,
                    )
                    .expect("quantize");
                });
                let directions = usage.rowwise as usize + usage.columnwise as usize;
                let gbps = (input_bytes + directions * elements) as f64 / seconds / 1e9;
                println!(
                    "{{\"bench\":\"quantize\",\"format\":\"fp8-e4m3-scale\",\"encoder\":\"{encoder}\",\"usage\":\"{usage_name}\",\"shape\":[{rows},{cols}],\"dtype\":\"bf16\",\"time_us\":{:.1},\"gbps\":{gbps:.1},\"copy_gbps\":{copy_gbps:.1},\"ratio_to_copy\":{:.3}}}",
                    seconds * 1e6,
                    gbps / copy_gbps
                );
            }
            for (name, config) in &configs {
                if integer && matches!(config, FormatConfig::Nvfp4(_)) {
                    continue; // no FP8 element codes
                }
                for (usage_name, usage) in usages {
                    if !selected(&format!("{name} {encoder} {usage_name}")) {
                        continue;
                    }
                    // MXFP8 and FP8 block columnwise cases and every NVFP4 case run the
                    // launcher's kernel, then the tile kernel it replaced there
                    // ("kernel": "tile").
                    let tile_too = !integer
                        && ((usage.columnwise
                            && matches!(
                                config,
                                FormatConfig::Mxfp8(_) | FormatConfig::Fp8Block(_)
                            ))
                            || matches!(config, FormatConfig::Nvfp4(_)));
                    for kernel in ["launcher", "tile"] {
                        if kernel == "tile" && !tile_too {
                            continue;
                        }
                        burn_lowp_kernels::force_tile_quantize_kernels(kernel == "tile");
                        let mut call = || {
                            let _ = Backend::quantize_tensor(input.clone(), config, usage, false)
                                .expect("quantize");
                        };
                        let seconds = time(&client, iterations, 1, &mut call);
                        let host_seconds = host_time(&client, iterations, &mut call);
                        let directions = usage.rowwise as usize + usage.columnwise as usize;
                        let bytes = input_bytes + directions * output_bytes(config, elements);
                        let gbps = bytes as f64 / seconds / 1e9;
                        println!(
                            "{{\"bench\":\"quantize\",\"format\":\"{name}\",\"encoder\":\"{encoder}\",\"kernel\":\"{kernel}\",\"usage\":\"{usage_name}\",\"shape\":[{rows},{cols}],\"dtype\":\"bf16\",\"time_us\":{:.1},\"host_us\":{:.1},\"gbps\":{gbps:.1},\"copy_gbps\":{copy_gbps:.1},\"ratio_to_copy\":{:.3}}}",
                            seconds * 1e6,
                            host_seconds * 1e6,
                            gbps / copy_gbps
                        );
                    }
                    burn_lowp_kernels::force_tile_quantize_kernels(false);
                }
            }
        }
        burn_lowp_kernels::force_integer_fp8_encoder(false);
    }
}
