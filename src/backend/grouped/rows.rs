//! A grouped layer's token rows in their packed layout (`[tokens, cols]`, group after group)
//! read by the kernels that need them in the aligned layout (`GroupLayout`), so that no padded
//! copy is written: how a layer's rows lie (`InputRows`) and which way they move (`RowMove`),
//! the FP8 per-tensor scaling of a grouped quantize that reads them through the layout's row map
//! (`GroupedFp8Scaling`), and the epilogue that finishes a grouped GEMM's output (per-expert
//! scales, biases, unpad: `GroupEpilogue`). The signature types of those `GroupedOps`; their
//! Burn-op definitions are beside the trait (`backend::ops::grouped`).

use burn::tensor::ops::{FloatTensor, IntTensor};
use burn::tensor::TensorMetadata;

use super::GroupLayout;
use crate::backend::LowpBackend;
use crate::error::{LowpError, Result};
use crate::format::{Fp8CurrentScaling, Fp8Format};

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
/// (`GroupedOps::grouped_quantize_fp8_padded`).
#[derive(Debug, Clone)]
pub enum GroupedFp8Scaling<B: LowpBackend> {
    /// Current scaling: each group's amax (or under `GroupScaling::Shared` the largest).
    Current(Fp8CurrentScaling),
    /// Current scaling on per-group amaxes (f32, `[groups]`) a producer already took over the
    /// padded batch (`GroupedOps::grouped_dbias_amax`): no amax pass of its own.
    CurrentFromAmax {
        config: Fp8CurrentScaling,
        amax: B::Bytes,
    },
    /// Delayed scaling: one f32 scale column per group, and where the amaxes are recorded in
    /// place (`QuantizeOps::quantize_delayed_amax_in_place`).
    Delayed {
        fp8: Fp8Format,
        scales: crate::backend::ScaleColumns<B>,
        record: Option<crate::backend::AmaxHistoryColumns<B>>,
    },
}

/// What `GroupedOps::grouped_epilogue` applies to a grouped GEMM's output: per-group biases
/// `[groups, cols]` (y's dtype), per-group scale pairs (f32 `[groups]` each) and a row gather.
#[derive(Debug, Clone)]
pub struct GroupEpilogue<B: LowpBackend> {
    pub bias: Option<FloatTensor<B>>,
    pub scales: Option<(FloatTensor<B>, FloatTensor<B>)>,
    pub gather: Option<IntTensor<B>>,
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
