//! FP8 delayed scaling (TE `DelayedScaling`, spec section 3): per module, one scale and one amax
//! history per quantizer slot. A quantize call uses the slot's current scale and records its amax
//! into row 0 of the history; at the end of the step `update` turns the history into new scales
//! and rolls it. The state is a Burn module of running-state tensors, so it is saved and loaded
//! with the model record, and every operation stays on the device (no host synchronization).

use burn::module::Module;
use burn::tensor::backend::Backend;
use burn::tensor::{DType, Tensor, TensorCreationOptions};
use serde::{Deserialize, Serialize};

use crate::error::{LowpError, Result};
pub use crate::backend::ops::quantize::delayed_update_by_ops;
use crate::backend::{AmaxHistoryColumns, ScaleColumns};
use crate::format::Fp8Format;
use crate::quant::state_tensor::StateTensor;

/// FP8 element formats of a recipe (TE `Format`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Fp8Recipe {
    /// E4M3 for every tensor.
    E4M3,
    /// E4M3 for forward tensors, E5M2 for gradients (TE's default for per-tensor scaling).
    Hybrid,
    /// E5M2 everywhere: rejected by every recipe, as in TE; accepted by the parser so that the
    /// error can say so.
    E5M2,
}

impl Fp8Recipe {
    pub fn name(self) -> &'static str {
        match self {
            Fp8Recipe::E4M3 => "e4m3",
            Fp8Recipe::Hybrid => "hybrid",
            Fp8Recipe::E5M2 => "e5m2",
        }
    }

    /// The element format of a forward (input, weight, output) or backward (gradient) tensor.
    pub fn element_format(self, forward: bool) -> Fp8Format {
        match (self, forward) {
            (Fp8Recipe::E4M3, _) | (Fp8Recipe::Hybrid, true) => Fp8Format::E4M3,
            (Fp8Recipe::Hybrid, false) | (Fp8Recipe::E5M2, _) => Fp8Format::E5M2,
        }
    }

    /// Errors on pure E5M2 (`path` names the field).
    pub fn validate(self, path: &str) -> Result<()> {
        if self == Fp8Recipe::E5M2 {
            return Err(LowpError::invalid(
                path,
                "e5m2",
                "pure E5M2 training is not supported (TE rejects it); use e4m3 or hybrid",
            ));
        }
        Ok(())
    }
}

/// How the scale's amax is taken from the history.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AmaxComputeAlgo {
    /// The maximum over the whole history, the current step included.
    Max,
    /// The current step's amax (history row 0).
    MostRecent,
}

fn hybrid() -> Fp8Recipe {
    Fp8Recipe::Hybrid
}

fn history_len() -> usize {
    1024
}

fn max_algo() -> AmaxComputeAlgo {
    AmaxComputeAlgo::Max
}

/// Delayed-scaling parameters (TE `DelayedScaling` / `DelayedScalingRequest` defaults).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DelayedScalingConfig {
    #[serde(default = "hybrid")]
    pub fp8_format: Fp8Recipe,
    /// The scale is `fp8_max / amax / 2^margin`.
    #[serde(default)]
    pub margin: i32,
    #[serde(default = "history_len")]
    pub amax_history_len: usize,
    #[serde(default = "max_algo")]
    pub amax_compute_algo: AmaxComputeAlgo,
}

impl Default for DelayedScalingConfig {
    fn default() -> Self {
        DelayedScalingConfig {
            fp8_format: hybrid(),
            margin: 0,
            amax_history_len: history_len(),
            amax_compute_algo: max_algo(),
        }
    }
}

impl DelayedScalingConfig {
    pub fn validate(&self, path: &str) -> Result<()> {
        self.fp8_format.validate(&format!("{path}.fp8_format"))?;
        if self.amax_history_len == 0 {
            return Err(LowpError::invalid(
                format!("{path}.amax_history_len"),
                0,
                "the history holds at least one step",
            ));
        }
        if !(-126..=126).contains(&self.margin) {
            return Err(LowpError::invalid(
                format!("{path}.margin"),
                self.margin,
                "must lie within -126..=126",
            ));
        }
        Ok(())
    }

    /// `fp8_max * 2^-margin`, the numerator of every new scale (exact: a power-of-two factor).
    pub fn scaled_max(&self, fp8: Fp8Format) -> f32 {
        fp8.max() * 2f32.powi(-self.margin)
    }
}

/// What a delayed-scaling cast takes from its module's state: the scale columns (one per group; a
/// plain tensor's is one), the slots' element format, and the history columns that receive its
/// amaxes in the cast's own launch where the backend can
/// (`QuantizeOps::quantize_delayed_amax_in_place`; elsewhere the caller records them after the
/// cast).
#[derive(Clone, Debug)]
pub struct DelayedCast<B: Backend> {
    pub scales: ScaleColumns<B>,
    pub fp8: Fp8Format,
    pub record: Option<AmaxHistoryColumns<B>>,
}

/// Creation options for an f32 tensor on `device`: scales and amaxes are f32 whatever the
/// backend's default float type (BF16 on a BF16 `CubeBackend`).
fn f32_on<B: Backend>(device: &B::Device) -> TensorCreationOptions<B> {
    TensorCreationOptions::new(device.clone()).with_dtype(DType::F32)
}

/// Scales `[slots]` and amax history `[history_len, slots]` of one module direction (forward or
/// backward). Scales start at 1, the history at 0.
#[derive(Module, Debug)]
pub struct DelayedScalingState<B: Backend> {
    pub scale: StateTensor<B, 1>,
    pub amax_history: StateTensor<B, 2>,
}

impl<B: Backend> DelayedScalingState<B> {
    pub fn new(config: &DelayedScalingConfig, slots: usize, device: &B::Device) -> Self {
        DelayedScalingState {
            scale: StateTensor::new(Tensor::ones([slots], f32_on(device))),
            amax_history: StateTensor::new(Tensor::zeros(
                [config.amax_history_len, slots],
                f32_on(device),
            )),
        }
    }

    /// Records a quantize call's amax (a one-element tensor) into the current history row:
    /// `history[0][slot] = max(history[0][slot], amax)`, so that several calls in one step (micro
    /// batches) keep the largest. Tensor ops, for backends whose casts cannot record in place
    /// (`QuantizeOps::quantize_delayed_amax_in_place`: CubeCL's casts fold the amax into row 0
    /// themselves).
    pub fn record_amax(&self, slot: usize, amax: Tensor<B, 1>) {
        let history = self.amax_history.value();
        let current = history.clone().slice([0..1, slot..slot + 1]);
        let merged = current.max_pair(amax.reshape([1, 1]));
        self.amax_history
            .set(history.slice_assign([0..1, slot..slot + 1], merged));
    }

    /// `record_amax` for several slots at once: `amax[i]` goes to `slots[i]` (distinct slots).
    /// One gather, one max and one masked write, whatever the number of slots.
    pub fn record_amaxes(&self, slots: &[usize], amax: Tensor<B, 1>) {
        let history = self.amax_history.value();
        let [_, width] = history.dims();
        let device = history.device();
        let indices = slot_indices::<B>(slots, &device);
        let row = history.clone().slice([0..1, 0..width]).reshape([width]);
        let merged = row
            .clone()
            .select(0, indices.clone())
            .max_pair(amax.reshape([slots.len()]));
        // Scatter into zeros (0 + v == v exactly) and keep it on the recorded slots only.
        let scattered = Tensor::<B, 1>::zeros([width], f32_on(&device)).scatter(
            0,
            indices,
            merged,
            burn::tensor::IndexingUpdateOp::Add,
        );
        let mut mask = vec![false; width];
        for &s in slots {
            mask[s] = true;
        }
        let mask = Tensor::<B, 1, burn::tensor::Bool>::from_data(
            burn::tensor::TensorData::new(mask, [width]),
            &device,
        );
        let row = row.mask_where(mask, scattered).reshape([1, width]);
        self.amax_history
            .set(history.slice_assign([0..1, 0..width], row));
    }
}

fn slot_indices<B: Backend>(slots: &[usize], device: &B::Device) -> Tensor<B, 1, burn::tensor::Int> {
    Tensor::from_data(
        burn::tensor::TensorData::new(
            slots.iter().map(|&s| s as i64).collect::<Vec<_>>(),
            [slots.len()],
        ),
        device,
    )
}
