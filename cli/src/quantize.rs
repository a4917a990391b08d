//! `lowp quantize`: one tensor of a safetensors file quantized with the reference quantizers (or
//! the kernels on wgpu or CUDA), its codes, scales and amaxes written to another.

use burn_lowp::error::{LowpError, Result};
use burn_lowp::format::{
    BlockShape, Direction, FormatConfig, Fp8BlockScaling, Fp8CurrentScaling, Fp8Format, HostMatrix,
    HostQuantized, Mxfp8Config, Nvfp4Config, QuantizedData, ScaleLayout, Scales, Usage,
};
use burn_lowp::tensor_file::{TensorFile, TensorWriter};

use crate::args::{CliFormat, Device, QuantizeArgs};

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
    burn_lowp::format::quantize(x, &format_config(format, options)?, usage)
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
            let mut q = burn_lowp::format::quantize(x, config, Usage::BOTH)?;
            if swizzled {
                q.swizzle_scales()?;
            }
            Ok(q)
        }
        Device::Wgpu => {
            #[cfg(feature = "wgpu")]
            {
                use burn_lowp_kernels::cubecl::wgpu::{WgpuDevice, WgpuRuntime};
                if !burn_lowp::backend::device::wgpu_available() {
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
                "this lowp was built without the `wgpu` feature (cargo build -p lowp --features wgpu)",
            ))
        }
        Device::Cuda => {
            #[cfg(feature = "cuda")]
            {
                use burn_lowp_kernels::cubecl::cuda::{CudaDevice, CudaRuntime};
                if !burn_lowp::backend::device::cuda_available() {
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
                "this lowp was built without the `cuda` feature (cargo build -p lowp --features cuda)",
            ))
        }
    }
}

#[cfg(any(feature = "wgpu", feature = "cuda"))]
fn quantize_with<B: burn_lowp::backend::LowpBackend>(
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
    let nvfp4 = matches!(q.format, burn_lowp::format::QuantFormat::Nvfp4 { .. });
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
