//! The debug config file: which layers to watch and what to do with them, in JSON, validated with
//! the JSON path of the offending field in errors (as recipe files are). The structure follows TE's
//! debug YAML (`transformer-engine-facts.md` section 8): named sections, each selecting layers by
//! name glob or module type and enabling features with their options.
//!
//! ```json
//! {
//!   "experts": {
//!     "layers": { "layer_name_patterns": ["layers.*.experts.*"] },
//!     "features": {
//!       "LogTensorStats": { "tensors": ["activation", "gradient"], "stats": ["max", "std"], "freq": 10 },
//!       "AutoswitchGemm": { "gemms": ["wgrad"], "underflow_threshold_pct": 5.0, "freq": 10 }
//!     }
//!   }
//! }
//! ```
//!
//! A layer belongs to at most one enabled section. Sampling: a feature with a schedule acts at
//! iteration `i` when `i % freq == 0` and `i` lies in `[start_step, end_step]` or in one of the
//! `start_end_list` ranges (TE's `next_enabled_iter`: absolute modulo, not relative to the start).

use std::collections::BTreeMap;
use std::path::Path;

use serde::Deserialize;

use crate::error::{LowpError, Result};
use crate::format::Fp8Format;
use crate::recipe::ModuleKind;

/// The tensors a layer's GEMMs read and write (TE's names).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum TensorKind {
    /// The GEMM input X (fprop and wgrad).
    Activation,
    /// The weight W (fprop and dgrad).
    Weight,
    /// The gradient dY (dgrad and wgrad).
    Gradient,
    /// The fprop output Y.
    Output,
    /// dX.
    Dgrad,
    /// dW.
    Wgrad,
}

impl TensorKind {
    pub fn name(self) -> &'static str {
        match self {
            TensorKind::Activation => "activation",
            TensorKind::Weight => "weight",
            TensorKind::Gradient => "gradient",
            TensorKind::Output => "output",
            TensorKind::Dgrad => "dgrad",
            TensorKind::Wgrad => "wgrad",
        }
    }

    /// Whether the tensor is a quantized GEMM operand (the others are GEMM outputs).
    pub fn is_operand(self) -> bool {
        matches!(
            self,
            TensorKind::Activation | TensorKind::Weight | TensorKind::Gradient
        )
    }
}

/// A layer's three GEMMs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum GemmName {
    Fprop,
    Dgrad,
    Wgrad,
}

impl GemmName {
    pub const ALL: [GemmName; 3] = [GemmName::Fprop, GemmName::Dgrad, GemmName::Wgrad];

    pub fn name(self) -> &'static str {
        match self {
            GemmName::Fprop => "fprop",
            GemmName::Dgrad => "dgrad",
            GemmName::Wgrad => "wgrad",
        }
    }

    /// The operands of the GEMM (AutoswitchGemm's inferred tensors).
    pub fn operands(self) -> [TensorKind; 2] {
        match self {
            GemmName::Fprop => [TensorKind::Activation, TensorKind::Weight],
            GemmName::Dgrad => [TensorKind::Gradient, TensorKind::Weight],
            GemmName::Wgrad => [TensorKind::Gradient, TensorKind::Activation],
        }
    }
}

/// Statistics of a high-precision tensor (`LogTensorStats`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Deserialize, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum TensorStat {
    Min,
    Max,
    Mean,
    Std,
    L1Norm,
    L2Norm,
    CurAmax,
    /// `log2(amax) - log2(min non-zero |x|)`.
    DynamicRange,
    /// Max over 1x32 blocks (along the last dimension) of the block's dynamic range.
    #[serde(rename = "max_blockwise_dynamic_range_1d")]
    MaxBlockwiseDynamicRange1d,
    /// Max over 32x32 blocks of the block's dynamic range.
    #[serde(rename = "max_blockwise_dynamic_range_2d")]
    MaxBlockwiseDynamicRange2d,
}

/// Statistics of a quantized representation against its source (`LogQuantizedTensorStats`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Deserialize, serde::Serialize)]
pub enum QuantizedStat {
    /// `100 · count(x != 0 and dequantized == 0) / numel`.
    #[serde(rename = "underflows%")]
    Underflows,
    /// `100 · count(|x| > fp8_max · scale_inv) / numel`; FP8 delayed scaling only.
    #[serde(rename = "overflows%")]
    Overflows,
    /// `mean((x - dequantized)²)`.
    #[serde(rename = "mse")]
    Mse,
    /// Smallest non-zero and largest `scale_inv` (block formats: over the blocks).
    #[serde(rename = "scale_inv_min")]
    ScaleInvMin,
    #[serde(rename = "scale_inv_max")]
    ScaleInvMax,
}

/// A recipe to compute quantized statistics for besides (or instead of) the one training: a
/// "what-if" shadow cast (TE's `<recipe>_<stat>` names).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Deserialize, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum WhatIfRecipe {
    Fp8CurrentScaling,
    Fp8BlockScaling,
    Mxfp8,
    Nvfp4,
}

impl WhatIfRecipe {
    pub fn name(self) -> &'static str {
        match self {
            WhatIfRecipe::Fp8CurrentScaling => "fp8_current_scaling",
            WhatIfRecipe::Fp8BlockScaling => "fp8_block_scaling",
            WhatIfRecipe::Mxfp8 => "mxfp8",
            WhatIfRecipe::Nvfp4 => "nvfp4",
        }
    }
}

/// When a feature samples: TE's `freq`, `start_step`, `end_step`, `start_end_list`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Schedule {
    pub freq: u64,
    pub start_step: Option<u64>,
    pub end_step: Option<u64>,
    pub start_end_list: Vec<[u64; 2]>,
}

impl Schedule {
    pub fn every(freq: u64) -> Schedule {
        Schedule {
            freq,
            ..Schedule::default()
        }
    }

    /// Whether iteration `it` is a sampling iteration.
    pub fn samples(&self, it: u64) -> bool {
        if it % self.freq.max(1) != 0 {
            return false;
        }
        if !self.start_end_list.is_empty() {
            return self.start_end_list.iter().any(|[s, e]| (*s..=*e).contains(&it));
        }
        self.start_step.is_none_or(|s| it >= s) && self.end_step.is_none_or(|e| it <= e)
    }

    fn check(&self, path: &str) -> Result<()> {
        if self.freq == 0 {
            return Err(LowpError::invalid(format!("{path}.freq"), 0, "must be at least 1"));
        }
        if let (Some(s), Some(e)) = (self.start_step, self.end_step) {
            if s > e {
                return Err(LowpError::invalid(
                    format!("{path}.start_step"),
                    s,
                    format!("must not exceed end_step = {e}"),
                ));
            }
        }
        if !self.start_end_list.is_empty() && (self.start_step.is_some() || self.end_step.is_some())
        {
            return Err(LowpError::invalid(
                format!("{path}.start_end_list"),
                "given with start_step/end_step",
                "use either start_end_list or start_step/end_step",
            ));
        }
        for (i, [s, e]) in self.start_end_list.iter().enumerate() {
            if s > e {
                return Err(LowpError::invalid(
                    format!("{path}.start_end_list[{i}]"),
                    format!("[{s}, {e}]"),
                    "a range's start must not exceed its end",
                ));
            }
        }
        Ok(())
    }
}

fn one() -> u64 {
    1
}

// The schedule fields (`freq`, `start_step`, `end_step`, `start_end_list`) are repeated in each
// feature that has them: serde's `flatten` cannot be combined with `deny_unknown_fields`, and
// unknown keys must be errors. `schedule()` (below) gathers them.

/// `LogTensorStats`: statistics of high-precision tensors.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LogTensorStats {
    pub tensors: Vec<TensorKind>,
    pub stats: Vec<TensorStat>,
    #[serde(default = "one")]
    pub freq: u64,
    #[serde(default)]
    pub start_step: Option<u64>,
    #[serde(default)]
    pub end_step: Option<u64>,
    #[serde(default)]
    pub start_end_list: Vec<[u64; 2]>,
}

/// `LogQuantizedTensorStats` (TE's `LogFp8TensorStats` / `LogNvfp4TensorStats`): statistics of
/// the quantized operands against their sources, for the training recipe (names `<stat>`,
/// `<stat>_columnwise`) and for `what_if` recipes (`<recipe>_<stat>[_columnwise]`).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LogQuantizedTensorStats {
    pub tensors: Vec<TensorKind>,
    pub stats: Vec<QuantizedStat>,
    /// Also the columnwise copies (the ones dgrad/wgrad read).
    #[serde(default)]
    pub columnwise: bool,
    #[serde(default)]
    pub what_if: Vec<WhatIfRecipe>,
    #[serde(default = "one")]
    pub freq: u64,
    #[serde(default)]
    pub start_step: Option<u64>,
    #[serde(default)]
    pub end_step: Option<u64>,
    #[serde(default)]
    pub start_end_list: Vec<[u64; 2]>,
}

/// `DisableQuantizationGEMM`: the listed GEMMs run in high precision.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DisableQuantizationGemm {
    pub gemms: Vec<GemmName>,
}

/// `DisableQuantizationLayer`: every GEMM of the layer runs in high precision.
#[derive(Debug, Clone, PartialEq, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct DisableQuantizationLayer {}

/// The element format of `FakeQuant`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub enum FakeQuantFormat {
    #[serde(rename = "FP8E4M3")]
    E4M3,
    #[serde(rename = "FP8E5M2")]
    E5M2,
}

impl FakeQuantFormat {
    pub fn fp8(self) -> Fp8Format {
        match self {
            FakeQuantFormat::E4M3 => Fp8Format::E4M3,
            FakeQuantFormat::E5M2 => Fp8Format::E5M2,
        }
    }
}

/// `FakeQuant`: the listed GEMMs run in high precision on their `tensors` quantized and
/// dequantized with a per-tensor current scale (other operands as they are).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FakeQuant {
    pub gemms: Vec<GemmName>,
    pub tensors: Vec<TensorKind>,
    pub quant_format: FakeQuantFormat,
}

/// `PerTensorScaling`: the listed tensors use FP8 current scaling instead of delayed scaling
/// (only where the recipe gives them a delayed-scaling quantizer). A tensor's quantizer makes
/// both its copies, so a tensor listed for any of `gemms` is current-scaled for all its GEMMs.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PerTensorScaling {
    pub gemms: Vec<GemmName>,
    pub tensors: Vec<TensorKind>,
}

/// What a GEMM that AutoswitchGemm switched to high precision multiplies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum HighPrecisionSource {
    /// The dequantized operands (TE's behaviour: values flushed to zero stay zero).
    #[default]
    Dequantized,
    /// The high-precision originals (undoes the underflow; the forward keeps them for backward).
    Original,
}

/// Whether a breach switches only its own GEMM or every GEMM of every layer (TE's
/// `hold_window_scope`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum HoldScope {
    #[default]
    Layer,
    Global,
}

/// When a switch decision takes effect.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SwitchTiming {
    /// In the iteration whose metrics crossed the threshold: the metrics are read on the host
    /// before the GEMM (one blocking read per monitored GEMM and sampling iteration).
    #[default]
    SameIteration,
    /// From the next sampling iteration on, through its hold window: the metrics are copied to
    /// the host asynchronously and read one sampling period later (no blocking read).
    NextSample,
}

/// `AutoswitchGemm` (TE PR #2883): a GEMM whose operands lose too much in quantization runs in
/// high precision. Per (layer, GEMM) and sampling iteration, the max over its monitored tensors of
/// the underflow percentage and of the MSE (or the MSE relative to `mean(x²)`) are compared with
/// the thresholds (strict `>`); a breach at iteration n switches the GEMM through `n + freq - 1`
/// (the hold window) and a later sample without breach releases it.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AutoswitchGemm {
    #[serde(default = "all_gemms")]
    pub gemms: Vec<GemmName>,
    /// Monitored tensors; by default each GEMM's operands.
    #[serde(default)]
    pub tensors: Option<Vec<TensorKind>>,
    #[serde(default = "default_underflow")]
    pub underflow_threshold_pct: Option<f64>,
    #[serde(default = "default_mse")]
    pub mse_threshold: Option<f64>,
    /// `mse / mean(x²)` threshold (scale-free); off by default.
    #[serde(default)]
    pub relative_mse_threshold: Option<f64>,
    #[serde(default)]
    pub high_precision_source: HighPrecisionSource,
    #[serde(default)]
    pub hold_window_scope: HoldScope,
    #[serde(default)]
    pub timing: SwitchTiming,
    /// Layers whose weight exists only quantized may switch fprop/dgrad on the dequantized weight.
    #[serde(default)]
    pub allow_quantized_only_weights: bool,
    #[serde(default = "one")]
    pub freq: u64,
    #[serde(default)]
    pub start_step: Option<u64>,
    #[serde(default)]
    pub end_step: Option<u64>,
    #[serde(default)]
    pub start_end_list: Vec<[u64; 2]>,
}

fn all_gemms() -> Vec<GemmName> {
    GemmName::ALL.to_vec()
}

fn default_underflow() -> Option<f64> {
    Some(5.0)
}

fn default_mse() -> Option<f64> {
    Some(1e-4)
}

impl AutoswitchGemm {
    /// The tensors monitored for `gemm`: its operands, filtered by `tensors` when given.
    pub fn monitored(&self, gemm: GemmName) -> Vec<TensorKind> {
        gemm.operands()
            .into_iter()
            .filter(|t| self.tensors.as_ref().is_none_or(|list| list.contains(t)))
            .collect()
    }
}

macro_rules! schedule_of {
    ($($t:ty),*) => {$(
        impl $t {
            pub fn schedule(&self) -> Schedule {
                Schedule {
                    freq: self.freq,
                    start_step: self.start_step,
                    end_step: self.end_step,
                    start_end_list: self.start_end_list.clone(),
                }
            }
        }
    )*};
}
schedule_of!(LogTensorStats, LogQuantizedTensorStats, AutoswitchGemm);

/// The features of a section (TE's names; the deprecated `DisableFP8GEMM` / `DisableFP8Layer`
/// are accepted too).
#[derive(Debug, Clone, PartialEq, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct Features {
    #[serde(rename = "LogTensorStats", default)]
    pub log_tensor_stats: Option<LogTensorStats>,
    #[serde(rename = "LogQuantizedTensorStats", alias = "LogFp8TensorStats", default)]
    pub log_quantized_tensor_stats: Option<LogQuantizedTensorStats>,
    #[serde(rename = "DisableQuantizationGEMM", alias = "DisableFP8GEMM", default)]
    pub disable_quantization_gemm: Option<DisableQuantizationGemm>,
    #[serde(rename = "DisableQuantizationLayer", alias = "DisableFP8Layer", default)]
    pub disable_quantization_layer: Option<DisableQuantizationLayer>,
    #[serde(rename = "FakeQuant", default)]
    pub fake_quant: Option<FakeQuant>,
    #[serde(rename = "PerTensorScaling", default)]
    pub per_tensor_scaling: Option<PerTensorScaling>,
    #[serde(rename = "AutoswitchGemm", default)]
    pub autoswitch_gemm: Option<AutoswitchGemm>,
}

/// Which layers a section applies to: any name glob or any module type matches.
#[derive(Debug, Clone, PartialEq, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct LayerSelector {
    #[serde(default)]
    pub layer_name_patterns: Vec<String>,
    /// Module types: `linear`, `layernorm_linear`, `layernorm_mlp`, `grouped_linear`.
    #[serde(default)]
    pub layer_types: Vec<String>,
}

pub const LAYER_TYPES: [&str; 4] = ["linear", "layernorm_linear", "layernorm_mlp", "grouped_linear"];

/// The type name of a module kind in `layer_types`.
pub fn layer_type(kind: &ModuleKind) -> &'static str {
    match kind {
        ModuleKind::Linear => "linear",
        ModuleKind::LayerNormLinear => "layernorm_linear",
        ModuleKind::LayerNormMlp => "layernorm_mlp",
        ModuleKind::GroupedLinear { .. } => "grouped_linear",
    }
}

impl LayerSelector {
    pub fn matches(&self, name: &str, kind: &ModuleKind) -> bool {
        self.layer_types.iter().any(|t| t == layer_type(kind))
            || self
                .layer_name_patterns
                .iter()
                .any(|p| glob::Pattern::new(p).is_ok_and(|p| p.matches(name)))
    }
}

fn yes() -> bool {
    true
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Section {
    #[serde(default = "yes")]
    pub enabled: bool,
    pub layers: LayerSelector,
    pub features: Features,
}

/// A debug config: named sections.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct DebugConfig {
    pub sections: BTreeMap<String, Section>,
}

impl DebugConfig {
    pub fn from_json(text: &str) -> Result<DebugConfig> {
        let mut de = serde_json::Deserializer::from_str(text);
        let sections: BTreeMap<String, Section> = serde_path_to_error::deserialize(&mut de)
            .map_err(|e| {
                let path = e.path().to_string();
                let path = if path == "." { "debug config".to_string() } else { path };
                LowpError::invalid(path, "JSON", e.inner().to_string())
            })?;
        let config = DebugConfig { sections };
        config.validate()?;
        Ok(config)
    }

    pub fn load(path: impl AsRef<Path>) -> Result<DebugConfig> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|e| {
            LowpError::invalid("debug config", path.display(), format!("cannot be read: {e}"))
        })?;
        DebugConfig::from_json(&text).map_err(|e| match e {
            LowpError::InvalidArgument { what, value, rule } => LowpError::InvalidArgument {
                what: format!("{}: {what}", path.display()),
                value,
                rule,
            },
            other => other,
        })
    }

    fn validate(&self) -> Result<()> {
        for (name, s) in &self.sections {
            let at = |field: &str| format!("{name}.{field}");
            if s.layers.layer_name_patterns.is_empty() && s.layers.layer_types.is_empty() {
                return Err(LowpError::invalid(
                    at("layers"),
                    "{}",
                    "select layers with layer_name_patterns or layer_types",
                ));
            }
            for (i, p) in s.layers.layer_name_patterns.iter().enumerate() {
                glob::Pattern::new(p).map_err(|e| {
                    LowpError::invalid(
                        at(&format!("layers.layer_name_patterns[{i}]")),
                        p,
                        format!("not a valid glob: {e}"),
                    )
                })?;
            }
            for (i, t) in s.layers.layer_types.iter().enumerate() {
                if !LAYER_TYPES.contains(&t.as_str()) {
                    return Err(LowpError::invalid(
                        at(&format!("layers.layer_types[{i}]")),
                        t,
                        format!("not a module type; expected one of {}", LAYER_TYPES.join(", ")),
                    ));
                }
            }
            let f = &s.features;
            if let Some(l) = &f.log_tensor_stats {
                l.schedule().check(&at("features.LogTensorStats"))?;
                nonempty(&l.tensors, &at("features.LogTensorStats.tensors"))?;
                nonempty(&l.stats, &at("features.LogTensorStats.stats"))?;
            }
            if let Some(l) = &f.log_quantized_tensor_stats {
                let p = at("features.LogQuantizedTensorStats");
                l.schedule().check(&p)?;
                nonempty(&l.stats, &format!("{p}.stats"))?;
                operands_only(&l.tensors, &format!("{p}.tensors"))?;
            }
            if let Some(d) = &f.disable_quantization_gemm {
                nonempty(&d.gemms, &at("features.DisableQuantizationGEMM.gemms"))?;
            }
            if let Some(q) = &f.fake_quant {
                let p = at("features.FakeQuant");
                nonempty(&q.gemms, &format!("{p}.gemms"))?;
                operands_only(&q.tensors, &format!("{p}.tensors"))?;
            }
            if let Some(q) = &f.per_tensor_scaling {
                let p = at("features.PerTensorScaling");
                nonempty(&q.gemms, &format!("{p}.gemms"))?;
                operands_only(&q.tensors, &format!("{p}.tensors"))?;
            }
            if let Some(a) = &f.autoswitch_gemm {
                let p = at("features.AutoswitchGemm");
                a.schedule().check(&p)?;
                nonempty(&a.gemms, &format!("{p}.gemms"))?;
                if let Some(t) = &a.tensors {
                    operands_only(t, &format!("{p}.tensors"))?;
                }
                for (field, v) in [
                    ("underflow_threshold_pct", a.underflow_threshold_pct),
                    ("mse_threshold", a.mse_threshold),
                    ("relative_mse_threshold", a.relative_mse_threshold),
                ] {
                    if let Some(v) = v {
                        if !(v.is_finite() && v >= 0.0) {
                            return Err(LowpError::invalid(
                                format!("{p}.{field}"),
                                v,
                                "must be a finite number >= 0 (or null to turn it off)",
                            ));
                        }
                    }
                }
                if a.underflow_threshold_pct.is_none()
                    && a.mse_threshold.is_none()
                    && a.relative_mse_threshold.is_none()
                {
                    return Err(LowpError::invalid(
                        p,
                        "every threshold null",
                        "AutoswitchGemm needs at least one threshold",
                    ));
                }
            }
        }
        Ok(())
    }

    /// The enabled section that selects layer `name` of `kind`: an error when two do.
    pub fn section_for(&self, name: &str, kind: &ModuleKind) -> Result<Option<(&str, &Section)>> {
        let mut found: Option<(&str, &Section)> = None;
        for (section_name, s) in &self.sections {
            if s.enabled && s.layers.matches(name, kind) {
                if let Some((first, _)) = found {
                    return Err(LowpError::invalid(
                        format!("debug config layer `{name}`"),
                        format!("selected by sections `{first}` and `{section_name}`"),
                        "a layer belongs to at most one section",
                    ));
                }
                found = Some((section_name, s));
            }
        }
        Ok(found)
    }
}

fn nonempty<T>(list: &[T], path: &str) -> Result<()> {
    if list.is_empty() {
        return Err(LowpError::invalid(path, "[]", "must list at least one entry"));
    }
    Ok(())
}

fn operands_only(list: &[TensorKind], path: &str) -> Result<()> {
    nonempty(list, path)?;
    if let Some(t) = list.iter().find(|t| !t.is_operand()) {
        return Err(LowpError::invalid(
            path,
            t.name(),
            "only GEMM operands (activation, weight, gradient) are quantized",
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(json: &str) -> String {
        DebugConfig::from_json(json).unwrap_err().to_string()
    }

    #[test]
    fn reads_sections_features_and_defaults() {
        let c = DebugConfig::from_json(
            r#"{ "s": { "layers": { "layer_name_patterns": ["layers.*.fc1"] },
                 "features": { "AutoswitchGemm": { "freq": 10 }, "DisableFP8GEMM": { "gemms": ["wgrad"] } } } }"#,
        )
        .unwrap();
        let s = &c.sections["s"];
        let a = s.features.autoswitch_gemm.as_ref().unwrap();
        assert_eq!((a.underflow_threshold_pct, a.mse_threshold), (Some(5.0), Some(1e-4)));
        assert_eq!(a.gemms, GemmName::ALL.to_vec());
        assert_eq!(a.monitored(GemmName::Dgrad), vec![TensorKind::Gradient, TensorKind::Weight]);
        assert_eq!(s.features.disable_quantization_gemm.as_ref().unwrap().gemms, vec![GemmName::Wgrad]);
        assert!(s.layers.matches("layers.3.fc1", &ModuleKind::Linear));
        assert!(!s.layers.matches("layers.3.fc2", &ModuleKind::Linear));
        let sched = a.schedule();
        assert!(sched.samples(0) && sched.samples(20) && !sched.samples(5));
        let listed = Schedule { freq: 2, start_end_list: vec![[4, 8], [20, 22]], ..Schedule::default() };
        assert_eq!((0..24).filter(|i| listed.samples(*i)).collect::<Vec<_>>(), vec![4, 6, 8, 20, 22]);
    }

    #[test]
    fn bad_configs_name_the_field_and_the_rule() {
        let layers = r#""layers": { "layer_types": ["linear"] }"#;
        let cases = [
            (format!(r#"{{ "s": {{ {layers}, "features": {{ "LogEverything": {{}} }} }} }}"#), "s.features"),
            (format!(r#"{{ "s": {{ {layers}, "features": {{ "LogTensorStats": {{ "tensors": ["activation"], "stats": ["median"] }} }} }} }}"#), "stats[0]"),
            (format!(r#"{{ "s": {{ {layers}, "features": {{ "AutoswitchGemm": {{ "freq": 0 }} }} }} }}"#), "s.features.AutoswitchGemm.freq"),
            (format!(r#"{{ "s": {{ {layers}, "features": {{ "AutoswitchGemm": {{ "mse_threshold": -1 }} }} }} }}"#), "mse_threshold"),
            (format!(r#"{{ "s": {{ {layers}, "features": {{ "AutoswitchGemm": {{ "underflow_threshold_pct": null, "mse_threshold": null }} }} }} }}"#), "at least one threshold"),
            (format!(r#"{{ "s": {{ {layers}, "features": {{ "FakeQuant": {{ "gemms": ["fprop"], "tensors": ["output"], "quant_format": "FP8E4M3" }} }} }} }}"#), "FakeQuant.tensors"),
            (format!(r#"{{ "s": {{ {layers}, "features": {{ "LogTensorStats": {{ "tensors": ["activation"], "stats": ["max"], "start_step": 9, "end_step": 2 }} }} }} }}"#), "start_step"),
            (r#"{ "s": { "layers": {}, "features": {} } }"#.to_string(), "s.layers"),
            (r#"{ "s": { "layers": { "layer_types": ["attention"] }, "features": {} } }"#.to_string(), "layer_types[0]"),
            (r#"{ "s": { "layers": { "layer_name_patterns": ["a[b"] }, "features": {} } }"#.to_string(), "not a valid glob"),
            ("[1, 2]".to_string(), "debug config"),
        ];
        for (json, needle) in cases {
            let e = err(&json);
            assert!(e.contains(needle), "{json}\n-> {e}\n(expected `{needle}`)");
        }
    }

    #[test]
    fn a_layer_in_two_enabled_sections_is_an_error() {
        let c = DebugConfig::from_json(
            r#"{ "a": { "layers": { "layer_types": ["linear"] }, "features": {} },
                 "b": { "layers": { "layer_name_patterns": ["x*"] }, "features": {} },
                 "c": { "enabled": false, "layers": { "layer_name_patterns": ["y"] }, "features": {} } }"#,
        )
        .unwrap();
        assert!(c.section_for("x1", &ModuleKind::Linear).is_err());
        assert_eq!(c.section_for("y", &ModuleKind::Linear).unwrap().unwrap().0, "a");
        assert!(c.section_for("y", &ModuleKind::LayerNormMlp).unwrap().is_none());
    }
}
