//! A grouped layer's token rows in their packed layout (`[tokens, cols]`, group after group)
//! read by the kernels that need them in the aligned layout (`grouped::GroupLayout`), so that no
//! padded copy is written: how a layer's rows lie (`InputRows`), the FP8 per-tensor scaling of a
//! grouped quantize that reads them through the layout's row map, the bias gradient that reads
//! them, and the epilogue that finishes a grouped GEMM's output (per-expert scales, biases,
//! unpad). Each `*_after_move` / `*_by_ops` function is its operation by definition (pad with a
//! row gather, then the plain op): the default of the `LowpBackend` method and the twin that the
//! fused kernels are tested against.

use burn::tensor::ops::{FloatTensor, IntTensor};
use burn::tensor::{Shape, Tensor, TensorMetadata, TensorPrimitive};

use super::grouped::GroupLayout;
use super::LowpBackend;
use crate::error::{LowpError, Result};
use crate::format::grouped::GroupScaling;
use crate::format::{FormatConfig, Fp8CurrentScaling, Fp8Format, Usage};
use crate::backend::quantized::QuantizedTensor;

/// How a grouped layer's token rows lie: the layout's aligned batch (`[layout.rows(), cols]`,
/// each group at a multiple of 128 rows, zero padding) or its packed tokens
/// (`[layout.tokens, cols]`, group after group). A `GroupedLinear` given packed rows pads them
/// inside the kernels that read them (the FP8 per-tensor cast, the bias gradient) and returns
/// packed rows: no padded copy is written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InputRows {
    Aligned,
    Packed,
}

impl InputRows {
    /// Rows of a `[rows, cols]` tensor laid out this way.
    pub fn rows<B: LowpBackend>(self, layout: &GroupLayout<B>) -> usize {
        match self {
            InputRows::Aligned => layout.rows(),
            InputRows::Packed => layout.tokens,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            InputRows::Aligned => "aligned",
            InputRows::Packed => "packed",
        }
    }
}

/// Which way rows move.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RowMove {
    /// Packed `[tokens, cols]` to aligned `[rows, cols]` (padding rows zero).
    Pad,
    /// Aligned to packed (padding rows dropped).
    Unpad,
}

impl RowMove {
    pub fn reverse(self) -> RowMove {
        match self {
            RowMove::Pad => RowMove::Unpad,
            RowMove::Unpad => RowMove::Pad,
        }
    }
}

/// Where the FP8 per-tensor scales of a grouped quantization come from
/// (`LowpBackend::quantize_fp8_grouped_padded`).
#[derive(Debug, Clone)]
pub enum GroupedFp8Scaling<B: LowpBackend> {
    /// Current scaling: each group's amax (or under `GroupScaling::Shared` the largest).
    Current(Fp8CurrentScaling),
    /// Current scaling on per-group amaxes (f32, `[groups]`) a producer already took over the
    /// padded batch (`LowpBackend::grouped_dbias_amax`): no amax pass of its own.
    CurrentFromAmax {
        config: Fp8CurrentScaling,
        amax: B::Bytes,
    },
    /// Delayed scaling: one f32 scale column per group, and where the amaxes are recorded in
    /// place (`LowpBackend::delayed_amax_in_place`).
    Delayed {
        fp8: Fp8Format,
        scales: super::ScaleColumns<B>,
        record: Option<super::AmaxHistoryColumns<B>>,
    },
}

/// `LowpBackend::quantize_fp8_grouped_padded` by its definition: the packed rows padded into the
/// aligned layout (`move_rows`), then the grouped quantize.
pub fn quantize_fp8_padded_after_move<B: LowpBackend>(
    x: FloatTensor<B>,
    layout: &GroupLayout<B>,
    scaling: GroupedFp8Scaling<B>,
    usage: Usage,
    group_scaling: GroupScaling,
) -> Result<QuantizedTensor<B>> {
    check_packed_rows(&x, layout)?;
    let aligned = crate::ops::grouped_rows::move_rows::<B>(x, layout, RowMove::Pad);
    match scaling {
        // (The amax equals the one the quantize takes itself: a maximum, in any order.)
        GroupedFp8Scaling::Current(config) | GroupedFp8Scaling::CurrentFromAmax { config, .. } => B::lowp_quantize_grouped(
            aligned,
            &layout.groups,
            &FormatConfig::Fp8Current(config),
            usage,
            group_scaling,
        ),
        GroupedFp8Scaling::Delayed { fp8, scales, record } => B::quantize_fp8_with_scale_grouped(
            aligned,
            fp8,
            scales,
            &layout.groups,
            usage,
            group_scaling,
            record,
        ),
    }
}

/// `LowpBackend::grouped_dbias_amax` without a kernel of its own: the rows padded where packed,
/// then `grouped_column_sum` in f32; no amax.
pub fn grouped_dbias_after_move<B: LowpBackend>(
    dy: FloatTensor<B>,
    rows: InputRows,
    layout: &GroupLayout<B>,
) -> Result<FloatTensor<B>> {
    let aligned = match rows {
        InputRows::Aligned => dy,
        InputRows::Packed => {
            check_packed_rows(&dy, layout)?;
            crate::ops::grouped_rows::move_rows::<B>(dy, layout, RowMove::Pad)
        }
    };
    let sums = B::grouped_column_sum(aligned, layout)?;
    Ok(B::float_cast(sums, burn::tensor::FloatDType::F32))
}

/// What `LowpBackend::lowp_group_epilogue` applies to a grouped GEMM's output: per-group biases
/// `[groups, cols]` (y's dtype), per-group scale pairs (f32 `[groups]` each) and a row gather.
#[derive(Debug, Clone)]
pub struct GroupEpilogue<B: LowpBackend> {
    pub bias: Option<FloatTensor<B>>,
    pub scales: Option<(FloatTensor<B>, FloatTensor<B>)>,
    pub gather: Option<IntTensor<B>>,
}

/// `LowpBackend::lowp_group_epilogue` in Burn tensor ops: the scale (in f32, rounded once to y's
/// dtype), the bias add, the gather, one after another.
pub fn group_epilogue_by_ops<B: LowpBackend>(
    y: FloatTensor<B>,
    row_group: IntTensor<B>,
    epilogue: GroupEpilogue<B>,
) -> FloatTensor<B> {
    use burn::tensor::FloatDType;
    let mut y = y;
    if let Some((scale_a, scale_b)) = epilogue.scales {
        let dtype = crate::backend::float_dtype(y.dtype());
        let groups = scale_a.shape().num_elements();
        let column = |t: FloatTensor<B>| {
            Tensor::<B, 2>::from_primitive(TensorPrimitive::Float(B::float_reshape(t, Shape::new([groups, 1]))))
        };
        let factor = column(scale_a).mul(column(scale_b));
        // Rows of no group read the zero row.
        let per_row = crate::ops::grouped_rows::select_rows_or_zero::<B>(
            factor.into_primitive().tensor(),
            row_group.clone(),
        );
        let scaled = Tensor::<B, 2>::from_primitive(TensorPrimitive::Float(B::float_cast(y, FloatDType::F32)))
            .mul(Tensor::from_primitive(TensorPrimitive::Float(per_row)));
        y = B::float_cast(scaled.into_primitive().tensor(), dtype);
    }
    if let Some(bias) = epilogue.bias {
        y = crate::ops::grouped_rows::add_selected_bias::<B>(y, bias, row_group);
    }
    match epilogue.gather {
        Some(index) => B::lowp_gather_rows(y, index),
        None => y,
    }
}

/// `x` is the packed `[layout.tokens, cols]` batch of `layout`.
pub fn check_packed_rows<B: LowpBackend>(x: &FloatTensor<B>, layout: &GroupLayout<B>) -> Result<()> {
    let shape = x.shape();
    let dims = shape.as_slice();
    if dims.len() != 2 || dims[0] != layout.tokens {
        return Err(LowpError::shape(
            "packed input",
            format!("{dims:?}"),
            format!("the [{}, cols] token rows of its layout", layout.tokens),
        ));
    }
    Ok(())
}
