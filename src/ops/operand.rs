//! How one operand of a quantized GEMM is quantized: its slot's quantizer and stochastic-rounding
//! seed (`OperandQuantizer`), under FP8 delayed scaling the slot's scale column and where its
//! amaxes go (`DelayedSlot`, `AmaxSink`), and a weight quantized in this call or reused from a
//! micro-batch cache (`WeightOperand`). Shared by the linear, grouped linear and LayerNormMLP ops.

use std::fmt;
use std::sync::Arc;

use burn::tensor::ops::FloatTensor;
use burn::tensor::{Shape, TensorMetadata};

use crate::backend::activation::ActivationSpec;
use crate::backend::{AmaxHistoryColumns, LowpBackend, ScaleColumns};
use crate::error::{LowpError, Result};
use crate::format::{Direction, Fp8Format, Usage};
use crate::quant::{quantize, DelayedCast, QuantizeCall, QuantizedTensor, QuantizerSpec};

/// Where a delayed-scaling operand's amaxes go: row 0 of its module's amax history, group g's
/// (a plain tensor's: g = 0) into column `first + g * stride`. Read when the cast runs, so that a
/// backward cast records into the history of its step.
#[derive(Clone)]
pub struct AmaxSink<Q: LowpBackend> {
    /// The module's history now (`[len, width]` f32): casts that record in place write into it.
    pub history: Arc<dyn Fn() -> FloatTensor<Q> + Send + Sync>,
    /// Records amaxes (`[groups]` f32) with tensor ops, for backends whose casts cannot.
    pub record: Arc<dyn Fn(FloatTensor<Q>) + Send + Sync>,
    pub first: usize,
    pub stride: usize,
}

impl<Q: LowpBackend> fmt::Debug for AmaxSink<Q> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "AmaxSink(columns {} + g * {})", self.first, self.stride)
    }
}

impl<Q: LowpBackend> AmaxSink<Q> {
    /// The history columns a cast on this backend records into itself, if it can.
    pub fn in_place(&self) -> Option<AmaxHistoryColumns<Q>> {
        Q::quantize_delayed_amax_in_place().then(|| AmaxHistoryColumns {
            history: (self.history)(),
            first: self.first,
            stride: self.stride,
        })
    }

    /// After a cast of `groups` groups: records its amaxes with tensor ops unless the cast did.
    pub fn after_cast(&self, q: &QuantizedTensor<Q>, usage: Usage, groups: usize) -> Result<()> {
        if Q::quantize_delayed_amax_in_place() {
            return Ok(());
        }
        let direction = if usage.rowwise {
            Direction::Rowwise
        } else {
            Direction::Columnwise
        };
        if let Some(amax) = q.quantized(direction)?.amax.as_ref() {
            (self.record)(Q::float_reshape(
                Q::bytes_as_float(amax, [1, groups]),
                Shape::new([groups]),
            ));
        }
        Ok(())
    }
}

/// A delayed-scaling slot: its current scale (a column of the module's scales), element format
/// and amax sink.
#[derive(Clone, Debug)]
pub struct DelayedSlot<Q: LowpBackend> {
    pub scale: ScaleColumns<Q>,
    pub fp8: Fp8Format,
    pub sink: AmaxSink<Q>,
}

/// How one operand is quantized: its slot's quantizer, the delayed-scaling slot if the quantizer
/// is a delayed request, and the stochastic-rounding seed of this call.
#[derive(Clone, Debug)]
pub struct OperandQuantizer<Q: LowpBackend> {
    pub name: String,
    pub spec: QuantizerSpec,
    pub delayed: Option<DelayedSlot<Q>>,
    pub seed: u64,
}

impl<Q: LowpBackend> OperandQuantizer<Q> {
    pub fn quantize(
        &self,
        x: FloatTensor<Q>,
        usage: Usage,
        optimize_for_gemm: bool,
    ) -> Result<QuantizedTensor<Q>> {
        let call = QuantizeCall {
            seed: self.seed,
            delayed: self.delayed.as_ref().map(|d| DelayedCast {
                scales: d.scale.clone(),
                fp8: d.fp8,
                record: d.sink.in_place(),
            }),
        };
        let q = quantize(x, &self.spec, usage, optimize_for_gemm, &call)?;
        if let Some(delayed) = &self.delayed {
            delayed.sink.after_cast(&q, usage, 1)?;
        }
        Ok(q)
    }

    /// Whether this quantizer would use an amax taken by the tensor's producer (FP8 current
    /// scaling; see `quantize_with_amax`).
    pub fn takes_amax(&self) -> bool {
        matches!(self.spec, QuantizerSpec::Fp8Current { .. })
    }

    /// As `quantize`, with `x`'s amax already on the device when its producer fused it (FP8
    /// current scaling then skips its amax pass; other quantizers ignore it).
    pub fn quantize_with_amax(
        &self,
        x: FloatTensor<Q>,
        amax: Option<Q::Bytes>,
        usage: Usage,
    ) -> Result<QuantizedTensor<Q>> {
        match amax {
            Some(amax) if self.takes_amax() => Q::quantize_fp8_current_with_amax(
                x,
                &self.spec.format_config(Some(self.seed))?,
                &amax,
                usage,
            ),
            _ => self.quantize(x, usage, false),
        }
    }

    /// The activation of `h` (`spec`) quantized by this quantizer without the activation's
    /// output in memory, where the backend fuses the activation into its FP8 cast:
    /// - delayed scaling, one pass (`ActivationOps::act_quantize_fp8_with_scale`);
    /// - current scaling, an amax pass over the activation and then the cast
    ///   (`act_quantize_fp8_current`). It reads `h` twice and computes the activation
    ///   twice, where the activation pass and the cast read `h`, write the output and read it
    ///   back. It measured slower with the earlier activation kernels (`tanhf`, IEEE division,
    ///   integer bf16 rounding; gelu at 8192 x 16384: 423 us against 388 us on an H200,
    ///   `benches/results/turns-h100/h200-final/mlp-pass.jsonl`); with the logistic on the GPU's
    ///   exponential and reciprocal units and the conversion instruction it is the shorter way
    ///   (H100, both directions: 330.5 us against 425.9 us for gelu, 494.1 against 510.7 for
    ///   swiglu; `benches/results/act-h100/call3/passes.jsonl`).
    ///
    /// `None` otherwise, and the caller runs the activation and then this quantizer (the same
    /// codes).
    pub fn quantize_activation(
        &self,
        h: FloatTensor<Q>,
        spec: &ActivationSpec,
        usage: Usage,
    ) -> Result<Option<QuantizedTensor<Q>>> {
        match (&self.spec, &self.delayed) {
            (QuantizerSpec::Fp8Delayed(_), Some(d)) => {
                let q = Q::act_quantize_fp8_with_scale(
                    h,
                    spec,
                    d.fp8,
                    d.scale.clone(),
                    usage,
                    d.sink.in_place(),
                )?;
                if let Some(q) = &q {
                    d.sink.after_cast(q, usage, 1)?;
                }
                Ok(q)
            }
            (QuantizerSpec::Fp8Current { .. }, _) => Q::act_quantize_fp8_current(
                h,
                spec,
                &self.spec.format_config(Some(self.seed))?,
                usage,
            ),
            _ => Ok(None),
        }
    }
}

/// The weight operand: quantize it in this call, or reuse a quantized copy (micro-batch cache).
#[derive(Clone, Debug)]
pub enum WeightOperand<Q: LowpBackend> {
    Quantize(OperandQuantizer<Q>),
    Cached(QuantizedTensor<Q>),
}

pub(crate) fn dims(t: &impl TensorMetadata) -> Vec<usize> {
    t.shape().as_slice().to_vec()
}

/// The weight operand of a GEMM: the cached copy (checked to hold what this call needs) or `w`
/// quantized rowwise, plus columnwise when dgrad will read it.
pub(crate) fn quantize_weight<Q: LowpBackend>(
    weight: &WeightOperand<Q>,
    w: FloatTensor<Q>,
    need_columnwise: bool,
) -> Result<QuantizedTensor<Q>> {
    let ws = dims(&w);
    match weight {
        WeightOperand::Cached(q) => {
            if q.rowwise.is_none()
                || (need_columnwise && q.columnwise.is_none())
                || (q.rows, q.cols) != (ws[0], ws[1])
            {
                return Err(LowpError::invalid(
                    "cached weight",
                    format!("[{}, {}] {:?}", q.rows, q.cols, q.usage()),
                    "lacks a representation this call needs",
                ));
            }
            Ok(q.clone())
        }
        WeightOperand::Quantize(quantizer) => quantizer.quantize(
            w,
            Usage {
                rowwise: true,
                columnwise: need_columnwise,
            },
            false,
        ),
    }
}
