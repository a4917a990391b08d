//! The quantize plumbing every cast on `CubeBackend` shares: the formats' kernel parameters (FP8
//! kinds and scale rules, NVFP4 options), the plain and activated FP8 casts, the delayed-scaling
//! state columns a cast reads and writes in place (`StateTarget`), and kernel outputs wrapped as a
//! `QuantizedTensor` (`wrap`) or relaid out (`relayout`, the scales' swizzle).

use burn::tensor::{DType, TensorMetadata};
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::{BoolElement, CubeBackend, CubeRuntime, FloatElement, IntElement};
use burn_lowp_kernels as kernels;
use burn_lowp_kernels::cubecl::prelude::*;
use burn_lowp_kernels::cubecl::server::Handle;
use kernels::scale::ScaleRule;
use kernels::{DirectionOutput, Directions, Fp8Kind, InputMatrix, KernelError, QuantizeOutput};

use super::buffers::{bytes, elem_kind, kernel_error, prepare};
use super::CubeBytes;
use crate::backend::activation::{Activation, ActivationSpec};
use crate::backend::{
    last_column, matrix_dims, AmaxHistoryColumns, Groups, LowpBackend, QuantizedStorage,
    QuantizedTensor, ScaleColumns, Storage, StorageScales,
};
use crate::backend::grouped::GROUP_ALIGN;
use crate::error::{LowpError, Result};
use crate::format::fp8_block::BlockShape;
use crate::format::random::{stream_key, COLUMNWISE_STREAM, ROWWISE_STREAM};
use crate::format::{
    check_shape, codes_shape, scales_shape, Direction, FormatConfig, Fp8Format, QuantFormat,
    ScaleLayout, Usage,
};

pub(crate) fn fp8_kind(fp8: Fp8Format) -> Fp8Kind {
    match fp8 {
        Fp8Format::E4M3 => Fp8Kind::E4M3,
        Fp8Format::E5M2 => Fp8Kind::E5M2,
    }
}

/// An FP8 storage's format, how its scales apply and its f32 scales, as the FP8 dequantize and
/// decoding statistics kernels read them (per-tensor `scale_inv` or block scales); `None` for
/// the other formats.
pub(crate) fn fp8_scaled<B: LowpBackend>(storage: &QuantizedStorage<B>) -> Option<(Fp8Format, kernels::Fp8Scales, &B::Bytes)> {
    match (&storage.format, &storage.scales) {
        (QuantFormat::Fp8Tensor { fp8 }, StorageScales::TensorScaleInv(s)) => Some((*fp8, kernels::Fp8Scales::Tensor, s)),
        (QuantFormat::Fp8Block { fp8, block }, StorageScales::BlockF32 { bytes, .. }) => {
            let kind = match block {
                BlockShape::OneByOneTwentyEight => kernels::Fp8Scales::Block1x128,
                BlockShape::OneTwentyEightSquare => kernels::Fp8Scales::Block128x128,
            };
            Some((*fp8, kind, bytes))
        }
        _ => None,
    }
}

/// The device scale rule of FP8 current scaling (a scale `fp8_max / amax` that overflows becomes
/// the largest f32, as TE's per-tensor current scaling).
pub(crate) fn current_scaling_rule(c: &crate::format::Fp8CurrentScaling) -> ScaleRule {
    ScaleRule {
        fp8: fp8_kind(c.fp8),
        pow2: c.pow2_scales,
        epsilon_bits: c.amax_epsilon.to_bits(),
        value_for_inf_bits: f32::MAX.to_bits(),
    }
}

/// NVFP4 kernel options; with `groups`, group g's stochastic rounding is seeded `seed + g`.
pub(crate) fn nvfp4_options(c: &crate::format::Nvfp4Config, groups: usize) -> kernels::Nvfp4Options {
    kernels::Nvfp4Options {
        block_2d: c.block_2d,
        rht: c.rht,
        stochastic_keys: c.stochastic_seed.map(|s| {
            (0..groups as u64)
                .map(|g| {
                    let seed = s.wrapping_add(g);
                    (
                        stream_key(seed, ROWWISE_STREAM),
                        stream_key(seed, COLUMNWISE_STREAM),
                    )
                })
                .collect()
        }),
    }
}

/// Grouped kernels take matrices whose groups fill whole 128-row chunks.
pub(crate) fn check_grouped_rows<R: CubeRuntime>(rows: usize, groups: &Groups<impl LowpBackend<Bytes = CubeBytes<R>>>) -> Result<()> {
    if rows != groups.rows || rows % GROUP_ALIGN != 0 {
        return Err(LowpError::shape(
            "grouped input",
            format!("M = {rows}"),
            format!("equals the rows of its groups ({}), a multiple of {GROUP_ALIGN}", groups.rows),
        ));
    }
    Ok(())
}

/// Wraps kernel outputs in a `QuantizedTensor`, with shapes from the format's layout rules.
/// `groups` is the number of per-tensor values (FP8 scale_inv, amaxes): 1, or one per group.
pub(crate) fn wrap<R: CubeRuntime, B: LowpBackend<Bytes = CubeBytes<R>>>(
    client: &ComputeClient<R>,
    device: &R::Device,
    out: QuantizeOutput,
    format: QuantFormat,
    (rows, cols): (usize, usize),
    swizzled: bool,
    groups: usize,
) -> QuantizedTensor<B> {
    let storage = |side: Option<DirectionOutput>, direction: Direction| {
        side.map(|d| {
            let cshape = codes_shape(&format, rows, cols, direction);
            let sshape = scales_shape(&format, rows, cols, direction);
            let scales = match format {
                QuantFormat::Fp8Tensor { .. } => {
                    StorageScales::TensorScaleInv(bytes(client, device, d.scales, 4 * groups))
                }
                QuantFormat::Fp8Block { .. } => StorageScales::BlockF32 {
                    shape: sshape,
                    bytes: bytes(client, device, d.scales, sshape[0] * sshape[1] * 4),
                },
                QuantFormat::Mxfp8 { .. } | QuantFormat::Nvfp4 { .. } => {
                    StorageScales::BlockBytes {
                        shape: sshape,
                        bytes: bytes(client, device, d.scales, sshape[0] * sshape[1]),
                        layout: if swizzled {
                            ScaleLayout::Swizzled
                        } else {
                            ScaleLayout::Compact
                        },
                    }
                }
            };
            Storage::Quantized(QuantizedStorage {
                format,
                codes: bytes(client, device, d.codes, cshape[0] * cshape[1]),
                codes_shape: cshape,
                scales,
                amax: d.amax.map(|a| bytes(client, device, a, 4 * groups)),
                shared_scale: false,
            })
        })
    };
    QuantizedTensor {
        rows,
        cols,
        rowwise: storage(out.rowwise, Direction::Rowwise),
        columnwise: storage(out.columnwise, Direction::Columnwise),
    }
}

/// Applies `f` to the block-scale bytes of each storage, producing `target`.
pub(crate) fn relayout<R: CubeRuntime, B: LowpBackend<Bytes = CubeBytes<R>>>(
    mut q: QuantizedTensor<B>,
    target: ScaleLayout,
    f: impl Fn(
        &ComputeClient<R>,
        &Handle,
        usize,
        usize,
        bool,
    ) -> std::result::Result<Handle, KernelError>,
) -> Result<QuantizedTensor<B>> {
    for (storage, direction) in [
        (q.rowwise.as_mut(), Direction::Rowwise),
        (q.columnwise.as_mut(), Direction::Columnwise),
    ] {
        let Some(Storage::Quantized(storage)) = storage else {
            continue;
        };
        // The GEMM reads MXFP8 columnwise scales [M/32, K] as their transpose.
        let transposed = match storage.format {
            QuantFormat::Mxfp8 { .. } => direction == Direction::Columnwise,
            QuantFormat::Nvfp4 { .. } => false,
            other => {
                return Err(LowpError::invalid(
                    "scale layout",
                    format!("{target:?}"),
                    format!(
                        "only MXFP8 and NVFP4 have swizzled block scales, not {}",
                        other.name()
                    ),
                ))
            }
        };
        if let StorageScales::BlockBytes {
            shape,
            bytes,
            layout,
        } = &mut storage.scales
        {
            if *layout == target {
                continue;
            }
            let [r, c] = if transposed {
                [shape[1], shape[0]]
            } else {
                *shape
            };
            bytes.handle = f(&bytes.client, &bytes.handle, r, c, transposed)
                .map_err(kernel_error("scales"))?;
            *layout = target;
        }
    }
    Ok(q)
}

/// `QuantizeOps::quantize_tensor`; with `amax` (f32 bits on the device, taken by the tensor's
/// producer), FP8 current scaling skips its amax pass (`quantize_fp8_current_with_amax`); other
/// formats have no use for it.
pub(crate) fn quantize_plain<R: CubeRuntime, B: LowpBackend<Bytes = CubeBytes<R>>>(
    x: CubeTensor<R>,
    config: &FormatConfig,
    usage: Usage,
    optimize_for_gemm: bool,
    amax: Option<&CubeBytes<R>>,
) -> Result<QuantizedTensor<B>> {
    let (rows, cols) = matrix_dims(&x.shape().as_slice());
    let format = config.format();
    check_shape("input", rows, cols, &format)?;
    let kind = elem_kind(x.dtype, "input")?;
    let x = prepare(x);
    let client = x.client.clone();
    let device = x.device.clone();
    let input = InputMatrix {
        handle: &x.handle,
        rows,
        cols,
        kind,
    };
    let directions = Directions {
        rowwise: usage.rowwise,
        columnwise: usage.columnwise,
    };
    let swizzled =
        optimize_for_gemm && matches!(config, FormatConfig::Mxfp8(_) | FormatConfig::Nvfp4(_));
    let out = match config {
        FormatConfig::Fp8Current(c) => {
            let rule = current_scaling_rule(c);
            let scaling = match amax {
                Some(amax) => kernels::TensorScaling::CurrentFromAmax {
                    rule,
                    amax: &amax.handle,
                },
                None => kernels::TensorScaling::Current { rule },
            };
            kernels::quantize_fp8_tensor(&client, input, rule.fp8, scaling, directions, None, false)
        }
        FormatConfig::Fp8Block(c) => {
            let rule = ScaleRule {
                fp8: fp8_kind(c.fp8),
                pow2: c.pow2_scales,
                epsilon_bits: c.amax_epsilon.to_bits(),
                value_for_inf_bits: kind.max_finite_bits(),
            };
            kernels::quantize_fp8_block(
                &client,
                input,
                rule,
                c.block == BlockShape::OneTwentyEightSquare,
                directions,
                None,
            )
        }
        FormatConfig::Mxfp8(c) => kernels::quantize_mxfp8(
            &client,
            input,
            fp8_kind(c.fp8),
            c.block_2d,
            directions,
            swizzled,
        ),
        FormatConfig::Nvfp4(c) => {
            kernels::quantize_nvfp4(&client, input, &nvfp4_options(c, 1), directions, swizzled, None)
        }
    }
    .map_err(kernel_error("input"))?;
    Ok(wrap(&client, &device, out, format, (rows, cols), swizzled, 1))
}

/// The FP8 per-tensor cast of `act(h)` by `cast` (one of the activated-cast launchers), with the
/// checks they share: a gated input of even width, an output FP8 can block.
pub(crate) fn activated_fp8_cast<R: CubeRuntime, B: LowpBackend<Bytes = CubeBytes<R>>>(
    h: CubeTensor<R>,
    spec: &ActivationSpec,
    fp8: Fp8Format,
    usage: Usage,
    cast: impl FnOnce(
        &ComputeClient<R>,
        InputMatrix,
        (kernels::fp8::Fp8Prologue, kernels::activation::ActivationParams),
        Directions,
    ) -> std::result::Result<kernels::QuantizeOutput, kernels::KernelError>,
) -> Result<Option<QuantizedTensor<B>>> {
    let (rows, h_cols) = matrix_dims(&h.shape().as_slice());
    let gated = spec.activation.is_gated();
    if gated && h_cols % 2 != 0 {
        return Err(LowpError::shape(
            "activation input",
            format!("[{rows}, {h_cols}]"),
            format!("{} takes two halves of one width", spec.activation),
        ));
    }
    let cols = if gated { h_cols / 2 } else { h_cols };
    let format = QuantFormat::Fp8Tensor { fp8 };
    check_shape("activation output", rows, cols, &format)?;
    let kind = elem_kind(h.dtype, "activation input")?;
    let h = prepare(h);
    let client = h.client.clone();
    let device = h.device.clone();
    let input = InputMatrix {
        handle: &h.handle,
        rows,
        cols: h_cols,
        kind,
    };
    let prologue = (
        kernels::fp8::Fp8Prologue {
            act: spec.activation.function(),
            gated,
            clamped_gate: spec.activation == Activation::ClampedSwiglu,
        },
        spec.kernel_params(),
    );
    let directions = Directions {
        rowwise: usage.rowwise,
        columnwise: usage.columnwise,
    };
    let out = cast(&client, input, prologue, directions).map_err(kernel_error("activation input"))?;
    Ok(Some(wrap(&client, &device, out, format, (rows, cols), false, 1)))
}

/// Columns `first + g * stride` of a module's delayed-scaling state that a cast reads (the
/// scales) or writes (row 0 of the amax history) in place, checked, held as a tensor that
/// outlives the launch.
pub(crate) struct StateTarget<R: CubeRuntime> {
    tensor: CubeTensor<R>,
    first: usize,
    stride: usize,
}

impl<R: CubeRuntime> StateTarget<R> {
    /// The scales of `ScaleColumns`, checked, as a contiguous tensor (the module's scale state
    /// already is one: no copy).
    pub(crate) fn scales<F: FloatElement, I: IntElement, BT: BoolElement>(
        columns: ScaleColumns<CubeBackend<R, F, I, BT>>,
        count: usize,
    ) -> Result<Self> {
        columns.indices(count)?;
        Ok(StateTarget {
            tensor: into_contiguous(columns.scales),
            first: columns.first,
            stride: columns.stride,
        })
    }

    pub(crate) fn kernel_arg(&self) -> kernels::StateColumns<'_> {
        kernels::StateColumns {
            buffer: &self.tensor.handle,
            first: self.first,
            stride: self.stride,
        }
    }
}

/// The history row a delayed cast records into (`AmaxHistoryColumns`), checked: an f32
/// `[len, width]` tensor whose row 0 the cast writes where it lies (columns one word apart; the
/// rows may be pitched, as CubeCL lays out `zeros([1024, 3])`), so that the writes land in the
/// module's tensor and not in a copy, holding the `count` columns `first + g * stride`.
pub(crate) fn history_row<R: CubeRuntime, F: FloatElement, I: IntElement, BT: BoolElement>(
    record: Option<AmaxHistoryColumns<CubeBackend<R, F, I, BT>>>,
    count: usize,
) -> Result<Option<StateTarget<R>>> {
    let Some(record) = record else {
        return Ok(None);
    };
    let history = record.history;
    let dims = history.shape().as_slice().to_vec();
    let strides = history.meta.strides().to_vec();
    let last = last_column(record.first, record.stride, count);
    let fits = dims.len() == 2 && last.is_some_and(|last| last < dims[1]);
    let row_in_place = strides.len() == 2 && strides[1] == 1 && strides[0] >= dims[1];
    if history.dtype != DType::F32 || !row_in_place || !fits {
        return Err(LowpError::shape(
            "amax history",
            format!(
                "{:?} {dims:?} strides {strides:?}, columns {} + g * {} for {count} groups",
                history.dtype, record.first, record.stride
            ),
            "an f32 [len, slots] history with unit column stride holding every recorded column",
        ));
    }
    Ok(Some(StateTarget {
        tensor: history,
        first: record.first,
        stride: record.stride,
    }))
}
