//! The `lowp` command line: quantize one tensor of a safetensors file with the reference
//! quantizers, or report how much precision each format loses on every tensor of a checkpoint.

use std::path::PathBuf;

use clap::{Parser, Subcommand, ValueEnum};

use crate::debug::QuantizationError;
use crate::error::{LowpError, Result};
use crate::format::{
    scaling::amax, BlockShape, Direction, FormatConfig, Fp8BlockScaling, Fp8CurrentScaling,
    Fp8Format, HostMatrix, HostQuantized, Mxfp8Config, Nvfp4Config, QuantizedData, ScaleLayout,
    Scales, Usage,
};
use crate::tensor_file::{TensorFile, TensorWriter};

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

    fn is_fp8_tensor(self) -> bool {
        matches!(self, CliFormat::Fp8E4m3 | CliFormat::Fp8E5m2)
    }

    fn is_fp8_block(self) -> bool {
        matches!(self, CliFormat::Fp8Block1x128 | CliFormat::Fp8Block128x128)
    }

    fn has_byte_scales(self) -> bool {
        !self.is_fp8_tensor() && !self.is_fp8_block()
    }
}

/// Options that change how a format quantizes.
#[derive(Debug, Clone, Copy, Default)]
pub struct QuantizeOptions {
    pub pow2_scales: bool,
    pub fp32_block_scales: bool,
    pub seed: Option<u64>,
}

impl QuantizeOptions {
    /// Rejects options that the format would silently ignore.
    fn validate(&self, format: CliFormat) -> Result<()> {
        if self.pow2_scales && !(format.is_fp8_tensor() || format.is_fp8_block()) {
            return Err(LowpError::invalid(
                "--pow2-scales",
                format.name(),
                "applies to fp8-e4m3, fp8-e5m2 and fp8-block-* only (MXFP8 scales are powers of two by construction, NVFP4 scales are E4M3)",
            ));
        }
        if self.fp32_block_scales && !format.is_fp8_block() {
            return Err(LowpError::invalid(
                "--fp32-block-scales",
                format.name(),
                "applies to fp8-block-1x128 and fp8-block-128x128 only",
            ));
        }
        if self.pow2_scales && self.fp32_block_scales {
            return Err(LowpError::invalid(
                "--pow2-scales with --fp32-block-scales",
                format.name(),
                "choose one scale kind",
            ));
        }
        if self.seed.is_some() && format != CliFormat::Nvfp4Sr {
            return Err(LowpError::invalid(
                "--seed",
                format.name(),
                "applies to nvfp4-sr only (the other formats round to nearest even)",
            ));
        }
        Ok(())
    }
}

/// The quantizer configuration a CLI format and its options stand for.
pub fn format_config(format: CliFormat, options: &QuantizeOptions) -> Result<FormatConfig> {
    options.validate(format)?;
    let current = |fp8| {
        FormatConfig::Fp8Current(Fp8CurrentScaling {
            pow2_scales: options.pow2_scales,
            ..Fp8CurrentScaling::new(fp8)
        })
    };
    let block = |shape| {
        FormatConfig::Fp8Block(Fp8BlockScaling {
            pow2_scales: !options.fp32_block_scales,
            ..Fp8BlockScaling::new(Fp8Format::E4M3, shape)
        })
    };
    let mx = |fp8, block_2d| FormatConfig::Mxfp8(Mxfp8Config { fp8, block_2d });
    let nv = |block_2d, rht, stochastic_seed| {
        FormatConfig::Nvfp4(Nvfp4Config {
            block_2d,
            rht,
            stochastic_seed,
        })
    };
    Ok(match format {
        CliFormat::Fp8E4m3 => current(Fp8Format::E4M3),
        CliFormat::Fp8E5m2 => current(Fp8Format::E5M2),
        CliFormat::Fp8Block1x128 => block(BlockShape::OneByOneTwentyEight),
        CliFormat::Fp8Block128x128 => block(BlockShape::OneTwentyEightSquare),
        CliFormat::Mxfp8E4m3 => mx(Fp8Format::E4M3, false),
        CliFormat::Mxfp8E5m2 => mx(Fp8Format::E5M2, false),
        CliFormat::Mxfp8E4m3TwoD => mx(Fp8Format::E4M3, true),
        CliFormat::Nvfp4 => nv(false, false, None),
        CliFormat::Nvfp4TwoD => nv(true, false, None),
        CliFormat::Nvfp4Rht => nv(false, true, None),
        CliFormat::Nvfp4Sr => nv(false, false, Some(options.seed.unwrap_or(0))),
    })
}

/// Quantizes `x` in `format` with the reference quantizers.
pub fn quantize(
    x: &HostMatrix,
    format: CliFormat,
    options: &QuantizeOptions,
    usage: Usage,
) -> Result<HostQuantized> {
    crate::format::quantize(x, &format_config(format, options)?, usage)
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

/// Quantizes both directions of `x` on `device`; swizzled scales come from the kernel itself.
pub fn quantize_on(
    device: Device,
    x: &HostMatrix,
    config: &FormatConfig,
    swizzled: bool,
) -> Result<HostQuantized> {
    match device {
        Device::Ndarray => {
            let mut q = crate::format::quantize(x, config, Usage::BOTH)?;
            if swizzled {
                q.swizzle_scales()?;
            }
            Ok(q)
        }
        Device::Wgpu => {
            #[cfg(feature = "wgpu")]
            {
                use burn_lowp_kernels::cubecl::wgpu::{WgpuDevice, WgpuRuntime};
                if !crate::backend::device::wgpu_available() {
                    return Err(LowpError::invalid("--device", "wgpu", "no Vulkan adapter on this machine (install mesa-vulkan-drivers for lavapipe)"));
                }
                quantize_with::<burn_cubecl::CubeBackend<WgpuRuntime, f32, i32, u32>>(
                    &WgpuDevice::default(),
                    x,
                    config,
                    swizzled,
                )
            }
            #[cfg(not(feature = "wgpu"))]
            Err(LowpError::invalid(
                "--device",
                "wgpu",
                "this lowp was built without the `wgpu` feature (cargo build --features wgpu)",
            ))
        }
        Device::Cuda => {
            #[cfg(feature = "cuda")]
            {
                use burn_lowp_kernels::cubecl::cuda::{CudaDevice, CudaRuntime};
                if !crate::backend::device::cuda_available() {
                    return Err(LowpError::invalid(
                        "--device",
                        "cuda",
                        "no CUDA driver or GPU on this machine",
                    ));
                }
                quantize_with::<burn_cubecl::CubeBackend<CudaRuntime, f32, i32, u8>>(
                    &CudaDevice::new(0),
                    x,
                    config,
                    swizzled,
                )
            }
            #[cfg(not(feature = "cuda"))]
            Err(LowpError::invalid(
                "--device",
                "cuda",
                "this lowp was built without the `cuda` feature (cargo build --features cuda)",
            ))
        }
    }
}

#[cfg(any(feature = "wgpu", feature = "cuda"))]
fn quantize_with<B: crate::backend::LowpBackend>(
    device: &B::Device,
    x: &HostMatrix,
    config: &FormatConfig,
    swizzled: bool,
) -> Result<HostQuantized> {
    let tensor = B::bytes_float_from_host(x, device);
    B::quantize_tensor(tensor, config, Usage::BOTH, swizzled)?.to_host()
}

/// Adds one representation's fields (`<direction>_data`, `<direction>_scale`, ...) to `out`.
fn add_fields(out: &mut TensorWriter, direction: Direction, data: &QuantizedData, nvfp4: bool) {
    let prefix = direction.name();
    out.add_u8(
        &format!("{prefix}_data"),
        data.codes_shape.to_vec(),
        data.codes.clone(),
    );
    match &data.scales {
        Scales::TensorScaleInv(scale_inv) => {
            // Both directions share the one scale; write it once.
            if direction == Direction::Rowwise {
                out.add_f32("scale_inv", vec![1], &[*scale_inv]);
            }
        }
        Scales::BlockF32 { shape, values } => {
            out.add_f32(&format!("{prefix}_scale"), shape.to_vec(), values)
        }
        Scales::BlockBytes {
            shape,
            bytes,
            layout,
        } => {
            let dims = match layout {
                ScaleLayout::Compact => shape.to_vec(),
                ScaleLayout::Swizzled => vec![bytes.len()],
            };
            out.add_u8(&format!("{prefix}_scale"), dims, bytes.clone());
        }
    }
    if let (true, Some(amax)) = (nvfp4, data.amax) {
        out.add_f32(&format!("{prefix}_amax"), vec![1], &[amax]);
    }
}

/// `lowp quantize`.
pub fn run_quantize(args: &QuantizeArgs) -> Result<String> {
    let file = TensorFile::open(&args.input)?;
    let x = file.read_matrix(&args.tensor)?;
    let options = QuantizeOptions {
        pow2_scales: args.pow2_scales,
        fp32_block_scales: args.fp32_block_scales,
        seed: args.seed,
    };
    if args.swizzled_scales && !args.format.has_byte_scales() {
        return Err(LowpError::invalid(
            "--swizzled-scales",
            args.format.name(),
            "applies to MXFP8 and NVFP4 only (FP8 scales are not block bytes)",
        ));
    }
    let config = format_config(args.format, &options)?;
    let q = quantize_on(args.device, &x, &config, args.swizzled_scales)?;
    let mut out = TensorWriter::default();
    let nvfp4 = matches!(q.format, crate::format::QuantFormat::Nvfp4 { .. });
    for direction in [Direction::Rowwise, Direction::Columnwise] {
        if let Some(data) = q.data(direction) {
            add_fields(&mut out, direction, data, nvfp4);
        }
    }
    out.set_metadata("format", args.format.name());
    out.set_metadata("device", format!("{:?}", args.device).to_lowercase());
    out.set_metadata("source_tensor", &args.tensor);
    out.set_metadata("source_dtype", x.dtype.name());
    out.set_metadata("matrix_shape", format!("[{}, {}]", x.rows, x.cols));
    out.set_metadata(
        "scale_layout",
        if args.swizzled_scales {
            "swizzled"
        } else {
            "compact"
        },
    );
    if let Some(seed) = args.seed {
        out.set_metadata("seed", seed);
    }
    out.write(&args.output)?;
    Ok(format!(
        "{}: [{}, {}] {} -> {} ({})",
        args.tensor,
        x.rows,
        x.cols,
        x.dtype.name(),
        args.output.display(),
        args.format.name()
    ))
}

/// The default formats `lowp inspect` measures.
pub const INSPECT_DEFAULT_FORMATS: [CliFormat; 4] = [
    CliFormat::Fp8E4m3,
    CliFormat::Fp8Block1x128,
    CliFormat::Mxfp8E4m3,
    CliFormat::Nvfp4,
];

/// Rowwise quantization error of `x` in `format`.
pub fn measure(x: &HostMatrix, format: CliFormat) -> Result<QuantizationError> {
    let options = QuantizeOptions {
        seed: (format == CliFormat::Nvfp4Sr).then_some(0),
        ..Default::default()
    };
    let q = quantize(x, format, &options, Usage::ROWWISE)?;
    QuantizationError::measure(&x.values, &q.dequantize(Direction::Rowwise)?)
}

/// `lowp inspect`: a precision report for every tensor of a file.
pub fn run_inspect(args: &InspectArgs) -> Result<String> {
    let file = TensorFile::open(&args.input)?;
    let formats: Vec<CliFormat> = if args.format.is_empty() {
        INSPECT_DEFAULT_FORMATS.to_vec()
    } else {
        args.format.clone()
    };
    let mut report = String::new();
    for name in file.names()? {
        let raw_shape = file.raw(&name)?.shape;
        let x = match file.read_matrix(&name) {
            Ok(x) => x,
            Err(LowpError::Dtype { dtype, .. }) => {
                report.push_str(&format!(
                    "{name}  shape {raw_shape:?}  dtype {dtype}  (skipped: not a float tensor)\n"
                ));
                continue;
            }
            Err(e) => return Err(e),
        };
        report.push_str(&format!(
            "{name}  shape {raw_shape:?}  dtype {}  amax {:.6e}\n",
            x.dtype.name(),
            amax(&x.values)
        ));
        for &format in &formats {
            match measure(&x, format) {
                Ok(e) => report.push_str(&format!(
                    "  {:<18} underflow {:>8.4}%  mse {:.6e}\n",
                    format.name(),
                    e.underflow_pct,
                    e.mse
                )),
                Err(e @ LowpError::Shape { .. }) => {
                    report.push_str(&format!("  {:<18} n/a: {e}\n", format.name()))
                }
                Err(e) => return Err(e),
            }
        }
    }
    Ok(report)
}

/// Runs a parsed command line; the binary prints the result or the error.
pub fn run(cli: &Cli) -> Result<String> {
    match &cli.command {
        Command::Quantize(args) => run_quantize(args),
        Command::Inspect(args) => run_inspect(args),
        Command::DebugSummary(args) => {
            Ok(crate::debug::summary::DebugSummary::read(&args.dir)?.to_markdown())
        }
    }
}
