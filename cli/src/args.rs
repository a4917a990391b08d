//! The `lowp` command line: the subcommands, their arguments, and the format and device names
//! they take.

use std::path::PathBuf;

use clap::{Parser, Subcommand, ValueEnum};

#[derive(Parser, Debug)]
#[command(
    name = "lowp",
    version,
    about = "Quantize and inspect safetensors checkpoints with burn-lowp's reference quantizers"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Quantize one tensor (flattened to 2D) and write its codes, scales and amaxes.
    Quantize(QuantizeArgs),
    /// Print, per tensor, shape, dtype, amax and each format's underflow % and MSE.
    Inspect(InspectArgs),
    /// Summarise a run's debug logs (a debug session's log directory): per layer and GEMM the
    /// AutoswitchGemm switches and worst tensors, per layer and tensor the quantization statistics.
    DebugSummary(DebugSummaryArgs),
}

#[derive(clap::Args, Debug)]
pub struct DebugSummaryArgs {
    /// The directory holding autoswitch-rank<r>.jsonl / debug_stats-rank<r>.jsonl.
    pub dir: PathBuf,
}

#[derive(clap::Args, Debug)]
pub struct QuantizeArgs {
    /// safetensors file to read.
    #[arg(long)]
    pub input: PathBuf,
    /// Name of the tensor to quantize (f32, f16 or bf16).
    #[arg(long)]
    pub tensor: String,
    #[arg(long, value_enum)]
    pub format: CliFormat,
    /// Round scales down to powers of two (FP8 current scaling; block scaling does by default).
    #[arg(long)]
    pub pow2_scales: bool,
    /// FP8 block scaling with exact f32 scales instead of powers of two.
    #[arg(long)]
    pub fp32_block_scales: bool,
    /// Write MXFP8/NVFP4 scales in the GEMM-swizzled 128x4-tile layout (1D byte tensors).
    #[arg(long)]
    pub swizzled_scales: bool,
    /// Seed of the stochastic-rounding generator (nvfp4-sr only; default 0).
    #[arg(long)]
    pub seed: Option<u64>,
    /// Where to quantize: the reference (ndarray), or the kernels on wgpu or cuda.
    #[arg(long, value_enum, default_value_t = Device::Ndarray)]
    pub device: Device,
    /// safetensors file to write.
    #[arg(long)]
    pub output: PathBuf,
}

#[derive(clap::Args, Debug)]
pub struct InspectArgs {
    /// safetensors file to read.
    #[arg(long)]
    pub input: PathBuf,
    /// Formats to measure (repeatable); default: fp8-e4m3, fp8-block-1x128, mxfp8-e4m3, nvfp4.
    #[arg(long, value_enum)]
    pub format: Vec<CliFormat>,
}

/// Formats the CLI can produce.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum CliFormat {
    /// FP8 E4M3, per-tensor current scaling.
    #[value(name = "fp8-e4m3")]
    Fp8E4m3,
    /// FP8 E5M2, per-tensor current scaling.
    #[value(name = "fp8-e5m2")]
    Fp8E5m2,
    /// FP8 E4M3 with f32 scales per 1x128 block.
    #[value(name = "fp8-block-1x128")]
    Fp8Block1x128,
    /// FP8 E4M3 with f32 scales per 128x128 tile.
    #[value(name = "fp8-block-128x128")]
    Fp8Block128x128,
    /// MXFP8 E4M3 (E8M0 scales per 32 elements).
    #[value(name = "mxfp8-e4m3")]
    Mxfp8E4m3,
    /// MXFP8 E5M2.
    #[value(name = "mxfp8-e5m2")]
    Mxfp8E5m2,
    /// MXFP8 E4M3 with one scale per 32x32 tile.
    #[value(name = "mxfp8-e4m3-2d")]
    Mxfp8E4m3TwoD,
    /// NVFP4, 1x16 blocks.
    #[value(name = "nvfp4")]
    Nvfp4,
    /// NVFP4, 16x16 tiles (weights).
    #[value(name = "nvfp4-2d")]
    Nvfp4TwoD,
    /// NVFP4, 1x16 blocks, random Hadamard transform on the columnwise copy.
    #[value(name = "nvfp4-rht")]
    Nvfp4Rht,
    /// NVFP4, 1x16 blocks, stochastic rounding.
    #[value(name = "nvfp4-sr")]
    Nvfp4Sr,
}

impl CliFormat {
    pub fn name(self) -> &'static str {
        match self {
            CliFormat::Fp8E4m3 => "fp8-e4m3",
            CliFormat::Fp8E5m2 => "fp8-e5m2",
            CliFormat::Fp8Block1x128 => "fp8-block-1x128",
            CliFormat::Fp8Block128x128 => "fp8-block-128x128",
            CliFormat::Mxfp8E4m3 => "mxfp8-e4m3",
            CliFormat::Mxfp8E5m2 => "mxfp8-e5m2",
            CliFormat::Mxfp8E4m3TwoD => "mxfp8-e4m3-2d",
            CliFormat::Nvfp4 => "nvfp4",
            CliFormat::Nvfp4TwoD => "nvfp4-2d",
            CliFormat::Nvfp4Rht => "nvfp4-rht",
            CliFormat::Nvfp4Sr => "nvfp4-sr",
        }
    }

    pub fn is_fp8_tensor(self) -> bool {
        matches!(self, CliFormat::Fp8E4m3 | CliFormat::Fp8E5m2)
    }

    pub fn is_fp8_block(self) -> bool {
        matches!(self, CliFormat::Fp8Block1x128 | CliFormat::Fp8Block128x128)
    }

    pub fn has_byte_scales(self) -> bool {
        !self.is_fp8_tensor() && !self.is_fp8_block()
    }
}

/// Where `lowp quantize` runs.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Device {
    /// The reference quantizers on the CPU.
    #[default]
    Ndarray,
    /// The CubeCL kernels through wgpu (Vulkan; lavapipe on a CPU). Needs the `wgpu` feature.
    Wgpu,
    /// The CubeCL kernels on the first CUDA GPU. Needs the `cuda` feature.
    Cuda,
}
