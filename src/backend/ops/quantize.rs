//! `QuantizeOps`: quantizing a plain (not grouped) tensor into one of the formats of `format`,
//! dequantizing it back, relaying block scales out for the GEMM, and FP8 delayed scaling's casts
//! and end-of-step state update. The delayed-scaling update's default (`delayed_update_by_ops`,
//! the CubeCL kernel's twin) is here; the quantizers themselves have no default: the format
//! references run on the host (`format`), which is what NdArray's implementation calls.

use burn::tensor::backend::Backend;
use burn::tensor::ops::FloatTensor;
use burn::tensor::{DType, Tensor, TensorCreationOptions, TensorPrimitive};

use super::rows::{reduce_rows, RowReduction};
use crate::backend::{AmaxHistoryColumns, LowpBackend, QuantizedTensor, ScaleColumns};
use crate::error::{LowpError, Result};
use crate::format::{Direction, FormatConfig, Fp8Format, Usage};

pub trait QuantizeOps<B: LowpBackend> {
    /// Quantizes `x` (any rank, viewed as `[prod(leading dims), last dim]`), producing the
    /// representations in `usage`. With `optimize_for_gemm`, MXFP8/NVFP4 scales are written
    /// GEMM-swizzled.
    fn quantize_tensor(
        x: FloatTensor<B>,
        config: &FormatConfig,
        usage: Usage,
        optimize_for_gemm: bool,
    ) -> Result<QuantizedTensor<B>>;

    /// FP8 current scaling of `x` with its amax already taken by the producer of `x` (f32 bits
    /// on the device, e.g. from `NormOps::norm_forward`): the quantize skips its amax pass. The
    /// default quantizes as `quantize_tensor` (the amax is the same by construction).
    fn quantize_fp8_current_with_amax(
        x: FloatTensor<B>,
        config: &FormatConfig,
        _amax: &B::Bytes,
        usage: Usage,
    ) -> Result<QuantizedTensor<B>> {
        B::quantize_tensor(x, config, usage, false)
    }

    /// Whether `quantize_fp8_with_scale` (and the grouped and activated delayed casts) fold the
    /// amaxes into the module's history (`AmaxHistoryColumns`) in the cast's own launch
    /// (CubeBackend). Where not (NdArray) they ignore `record`, and the caller records the
    /// result's amaxes with tensor ops.
    fn quantize_delayed_amax_in_place() -> bool {
        false
    }

    /// FP8 per-tensor quantization with a given scale (delayed scaling): `scale` is one column
    /// of f32 scales on the device; the result records this tensor's amax, and where
    /// `quantize_delayed_amax_in_place`, `record` also receives it (an atomic max into the
    /// history).
    fn quantize_fp8_with_scale(
        x: FloatTensor<B>,
        fp8: Fp8Format,
        scale: ScaleColumns<B>,
        usage: Usage,
        record: Option<AmaxHistoryColumns<B>>,
    ) -> Result<QuantizedTensor<B>>;

    /// TE's delayed-scaling end-of-step update of one module direction: from the amax history
    /// `[len, width]` and scales `[width]` (f32), the new scales (`numerator / amax` of the
    /// history's max, or of row 0 under `most_recent`; a zero or non-finite amax keeps the old
    /// scale) and the rolled history with a zero row 0. The default is tensor ops
    /// (`delayed_update_by_ops`, about fourteen launches); CubeBackend runs one kernel
    /// (`kernels::delayed_scaling`), bit for bit the same.
    fn quantize_delayed_update(
        history: FloatTensor<B>,
        scale: FloatTensor<B>,
        numerator: f32,
        most_recent: bool,
    ) -> Result<(FloatTensor<B>, FloatTensor<B>)> {
        delayed_update_by_ops::<B>(history, scale, numerator, most_recent)
    }

    /// Dequantizes one representation to an f32 `[rows, cols]` tensor. Block scales must be
    /// compact.
    fn quantize_dequantize(q: &QuantizedTensor<B>, direction: Direction) -> Result<FloatTensor<B>>;

    /// Rewrites MXFP8/NVFP4 block scales into the GEMM-swizzled layout.
    fn quantize_swizzle_scales(q: QuantizedTensor<B>) -> Result<QuantizedTensor<B>>;

    /// Rewrites swizzled block scales back into the compact layout.
    fn quantize_unswizzle_scales(q: QuantizedTensor<B>) -> Result<QuantizedTensor<B>>;
}

/// Creation options for an f32 tensor on `device`: scales and amaxes are f32 whatever the
/// backend's default float type (BF16 on a BF16 `CubeBackend`).
fn f32_on<B: Backend>(device: &B::Device) -> TensorCreationOptions<B> {
    TensorCreationOptions::new(device.clone()).with_dtype(DType::F32)
}

/// Rows of the amax history maxed per block in the first stage of `reduce_rows` (TE's default
/// history is 1024 x slots: 32 blocks of 32).
const HISTORY_BLOCK: usize = 32;

/// `QuantizeOps::quantize_delayed_update` as tensor ops (the default, and the CubeCL kernel's
/// twin): a blocked max over the history's rows (or row 0), the scale rule elementwise, the roll as
/// a `cat`, row 0 zeroed.
pub fn delayed_update_by_ops<B: Backend>(
    history: FloatTensor<B>,
    scale: FloatTensor<B>,
    numerator: f32,
    most_recent: bool,
) -> Result<(FloatTensor<B>, FloatTensor<B>)> {
    let history = Tensor::<B, 2>::from_primitive(TensorPrimitive::Float(history));
    let old = Tensor::<B, 1>::from_primitive(TensorPrimitive::Float(scale));
    let [len, slots] = history.dims();
    if old.dims() != [slots] {
        return Err(LowpError::shape(
            "delayed-scaling scales",
            format!("{:?} for a history of {slots} slots", old.dims()),
            "one scale per history column",
        ));
    }
    let amax = if most_recent {
        history.clone().slice([0..1, 0..slots])
    } else {
        reduce_rows(history.clone(), HISTORY_BLOCK, RowReduction::Max)
    }
    .reshape([slots]);
    let numerator = Tensor::<B, 1>::full([slots], numerator, f32_on(&amax.device()));
    let candidate = numerator.div(amax.clone()).clamp_max(f32::MAX);
    let valid = amax.clone().is_finite().bool_and(amax.greater_elem(0.0));
    let scale = old.mask_where(valid, candidate);
    let rolled = if len > 1 {
        Tensor::cat(
            vec![
                history.clone().slice([1..len, 0..slots]),
                history.slice([0..1, 0..slots]),
            ],
            0,
        )
    } else {
        history
    };
    let zeros = Tensor::<B, 2>::zeros([1, slots], f32_on(&rolled.device()));
    let rolled = rolled.slice_assign([0..1, 0..slots], zeros);
    Ok((
        rolled.into_primitive().tensor(),
        scale.into_primitive().tensor(),
    ))
}
