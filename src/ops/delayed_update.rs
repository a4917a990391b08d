//! The end-of-step update of a module's FP8 delayed-scaling state (`quant::DelayedScalingState`)
//! on its backend's op (`QuantizeOps::quantize_delayed_update`, one kernel on CubeCL backends).
//! An inherent method of the quant type, defined here because it reaches the backend through
//! `LowpLinear`'s inner backend, and `quant` sits below `ops`.

use burn::tensor::{Tensor, TensorPrimitive};

use super::LowpLinear;
use crate::backend::QuantizeOps;
use crate::error::Result;
use crate::format::Fp8Format;
use crate::quant::{AmaxComputeAlgo, DelayedScalingConfig, DelayedScalingState};

impl<B: LowpLinear> DelayedScalingState<B> {
    /// TE's end-of-step update (`delayed_scaling.cu`), for slots whose elements are `fp8`:
    /// 1. `amax` = max over the history (`max`) or its row 0 (`most_recent`), before the roll;
    /// 2. `new_scale = (fp8_max * 2^-margin) / amax`, infinity clamped to f32::MAX;
    /// 3. a non-finite or non-positive amax keeps the old scale;
    /// 4. roll: `new[i] = old[i + 1]`, `new[len - 1] = old[0]`, then `new[0] = 0`.
    ///
    /// One launch on CubeCL backends (`QuantizeOps::quantize_delayed_update`); errors only on a
    /// state whose history and scales disagree (a record from another model).
    pub fn update(&self, config: &DelayedScalingConfig, fp8: Fp8Format) -> Result<()> {
        let quant = |t: Tensor<B, 1>| B::to_quant(t.into_primitive().tensor());
        let history = B::to_quant(self.amax_history.value().into_primitive().tensor());
        let (history, scale) = B::Quant::quantize_delayed_update(
            history,
            quant(self.scale.value()),
            config.scaled_max(fp8),
            config.amax_compute_algo == AmaxComputeAlgo::MostRecent,
        )?;
        let float = |t| TensorPrimitive::Float(B::from_quant(t));
        self.scale.set(Tensor::from_primitive(float(scale)));
        self.amax_history.set(Tensor::from_primitive(float(history)));
        Ok(())
    }
}
