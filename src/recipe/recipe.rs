//! `Recipe`: which quantizer every slot of every module gets, loaded from a JSON file and switched
//! without recompiling. The built-in recipes carry TE's defaults; `custom` holds rules.
//!
//! ```json
//! { "recipe": "mxfp8", "fp8_format": "e4m3", "enable_2d_quantization": false }
//! ```

use std::path::Path;

use serde::{Deserialize, Serialize};

use super::custom::CustomRecipe;
use super::gemm_params::{MmParams, SplitAccumulator};
use super::role::{slot_tensor_type, Pass, QuantizerRole, SlotLayout, WEIGHT};
use crate::error::{LowpError, Result};
use crate::format::fp8_block::BlockShape;
use crate::quant::{DelayedScalingConfig, Fp8Recipe, QuantizerSpec};

fn hybrid() -> Fp8Recipe {
    Fp8Recipe::Hybrid
}

fn e4m3() -> Fp8Recipe {
    Fp8Recipe::E4M3
}

fn one() -> u8 {
    1
}

fn two() -> u8 {
    2
}

fn yes() -> bool {
    true
}

/// TE `Float8CurrentScaling`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CurrentScalingRecipe {
    #[serde(default = "hybrid")]
    pub fp8_format: Fp8Recipe,
    #[serde(default)]
    pub power_2_scales: bool,
    #[serde(default)]
    pub amax_epsilon: f32,
    /// TE's `MMParams` per GEMM: fprop fast accumulation, dgrad and wgrad the split accumulator
    /// unless set (`{"use_split_accumulator": false}`).
    #[serde(default = "super::gemm_params::fast")]
    pub fp8_gemm_fprop: MmParams,
    #[serde(default = "super::gemm_params::split")]
    pub fp8_gemm_dgrad: MmParams,
    #[serde(default = "super::gemm_params::split")]
    pub fp8_gemm_wgrad: MmParams,
}

/// TE `Float8BlockScaling`: block dimension 1 means 1x128 blocks, 2 means 128x128 tiles.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BlockScalingRecipe {
    #[serde(default = "e4m3")]
    pub fp8_format: Fp8Recipe,
    #[serde(default = "one")]
    pub x_block_scaling_dim: u8,
    #[serde(default = "two")]
    pub w_block_scaling_dim: u8,
    #[serde(default = "one")]
    pub grad_block_scaling_dim: u8,
    #[serde(default = "yes")]
    pub power_2_scales: bool,
    #[serde(default)]
    pub amax_epsilon: f32,
}

/// TE `MXFP8BlockScaling`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Mxfp8Recipe {
    #[serde(default = "e4m3")]
    pub fp8_format: Fp8Recipe,
    /// 32x32 blocks for linear / grouped-linear weights in the forward pass.
    #[serde(default)]
    pub enable_2d_quantization: bool,
}

/// TE `NVFP4BlockScaling`: 16x16 weights, RHT on activation and gradient columnwise copies,
/// stochastic rounding for gradients; each can be turned off.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct Nvfp4Recipe {
    #[serde(default)]
    pub disable_rht: bool,
    #[serde(default)]
    pub disable_stochastic_rounding: bool,
    #[serde(default)]
    pub disable_2d_quantization: bool,
}

/// A recipe file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "recipe", rename_all = "snake_case", deny_unknown_fields)]
pub enum Recipe {
    DelayedScaling(DelayedScalingConfig),
    CurrentScaling(CurrentScalingRecipe),
    BlockScaling(BlockScalingRecipe),
    Mxfp8(Mxfp8Recipe),
    Nvfp4(Nvfp4Recipe),
    /// No quantization: every slot keeps BF16.
    Bf16,
    Custom(CustomRecipe),
}

impl burn::config::Config for Recipe {}

/// The quantizer of one slot, with the role it was resolved for.
#[derive(Debug, Clone, PartialEq)]
pub struct SlotQuantizer {
    pub role: Option<QuantizerRole>,
    /// The slot's tensor type (the role's, or TE's positional fallback).
    pub tensor_type: String,
    pub spec: QuantizerSpec,
}

/// Every slot of one module, resolved.
#[derive(Debug, Clone, PartialEq)]
pub struct ModuleQuantizers {
    pub forward: Vec<SlotQuantizer>,
    pub backward: Vec<SlotQuantizer>,
    /// The module's delayed-scaling state parameters, if any slot requests delayed scaling.
    pub delayed: Option<DelayedScalingConfig>,
    /// How its FP8 per-tensor GEMMs accumulate (TE's defaults unless the recipe sets them).
    pub split_accumulator: SplitAccumulator,
    /// Non-fatal findings (e.g. stochastic rounding outside gradients).
    pub warnings: Vec<String>,
}

impl Recipe {
    /// Parses a recipe from JSON; errors name the JSON path (`rules[2].quantizer.format: ...`).
    /// The recipe is validated too.
    pub fn from_json(text: &str) -> Result<Recipe> {
        let recipe = super::json::recipe(text)?;
        recipe.validate()?;
        Ok(recipe)
    }

    /// Loads and validates a recipe file.
    pub fn load(path: impl AsRef<Path>) -> Result<Recipe> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|e| LowpError::file(path, e))?;
        Recipe::from_json(&text).map_err(|e| LowpError::file(path, e))
    }

    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("a recipe serializes")
    }

    /// Checks the rules TE enforces, naming the JSON path of the offending field; returns
    /// warnings.
    pub fn validate(&self) -> Result<Vec<String>> {
        match self {
            Recipe::DelayedScaling(c) => c.validate("recipe").map(|_| Vec::new()),
            Recipe::CurrentScaling(c) => {
                c.fp8_format.validate("fp8_format")?;
                epsilon(c.amax_epsilon, "amax_epsilon")?;
                Ok(Vec::new())
            }
            Recipe::BlockScaling(c) => {
                c.fp8_format.validate("fp8_format")?;
                epsilon(c.amax_epsilon, "amax_epsilon")?;
                for (field, dim) in [
                    ("x_block_scaling_dim", c.x_block_scaling_dim),
                    ("w_block_scaling_dim", c.w_block_scaling_dim),
                    ("grad_block_scaling_dim", c.grad_block_scaling_dim),
                ] {
                    if dim != 1 && dim != 2 {
                        return Err(LowpError::invalid(
                            field,
                            dim,
                            "1 (1x128 blocks) or 2 (128x128 tiles)",
                        ));
                    }
                }
                for (a, da, b, db, gemm) in [
                    (
                        "x_block_scaling_dim",
                        c.x_block_scaling_dim,
                        "w_block_scaling_dim",
                        c.w_block_scaling_dim,
                        "fprop",
                    ),
                    (
                        "grad_block_scaling_dim",
                        c.grad_block_scaling_dim,
                        "w_block_scaling_dim",
                        c.w_block_scaling_dim,
                        "dgrad",
                    ),
                    (
                        "x_block_scaling_dim",
                        c.x_block_scaling_dim,
                        "grad_block_scaling_dim",
                        c.grad_block_scaling_dim,
                        "wgrad",
                    ),
                ] {
                    if da == 2 && db == 2 {
                        return Err(LowpError::invalid(
                            format!("{a} with {b}"),
                            "2 and 2",
                            format!("the {gemm} GEMM would take two 128x128-block operands; at most one may be 2D"),
                        ));
                    }
                }
                Ok(Vec::new())
            }
            Recipe::Mxfp8(c) => c.fp8_format.validate("fp8_format").map(|_| Vec::new()),
            Recipe::Nvfp4(_) | Recipe::Bf16 => Ok(Vec::new()),
            Recipe::Custom(c) => c.validate(),
        }
    }

    /// The quantizer this recipe gives slot `index` of `pass`, whose role is `role`.
    pub fn quantizer(
        &self,
        role: Option<&QuantizerRole>,
        pass: Pass,
        index: usize,
    ) -> QuantizerSpec {
        let forward = pass == Pass::Forward;
        let tensor_type = slot_tensor_type(role, pass, index);
        match self {
            Recipe::DelayedScaling(c) => QuantizerSpec::Fp8Delayed(c.clone()),
            Recipe::CurrentScaling(c) => QuantizerSpec::Fp8Current {
                fp8: c.fp8_format.element_format(forward),
                pow2_scales: c.power_2_scales,
                amax_epsilon: c.amax_epsilon,
            },
            Recipe::BlockScaling(c) => {
                let dim = match (forward, tensor_type == WEIGHT) {
                    (true, true) => c.w_block_scaling_dim,
                    (true, false) => c.x_block_scaling_dim,
                    (false, _) => c.grad_block_scaling_dim,
                };
                QuantizerSpec::Fp8Block {
                    fp8: c.fp8_format.element_format(forward),
                    block: if dim == 2 {
                        BlockShape::OneTwentyEightSquare
                    } else {
                        BlockShape::OneByOneTwentyEight
                    },
                    pow2_scales: c.power_2_scales,
                    amax_epsilon: c.amax_epsilon,
                }
            }
            Recipe::Mxfp8(c) => {
                // 2D blocks only for linear weights, forward, as TE decides them: by role.
                let linear_weight = role.is_some_and(|r| {
                    (r.module_type == "linear" || r.module_type == "grouped_linear")
                        && r.tensor_type == WEIGHT
                });
                QuantizerSpec::Mxfp8 {
                    fp8: c.fp8_format.element_format(forward),
                    block_2d: c.enable_2d_quantization && forward && linear_weight,
                }
            }
            Recipe::Nvfp4(c) => {
                if forward && tensor_type == WEIGHT {
                    QuantizerSpec::Nvfp4 {
                        block_2d: !c.disable_2d_quantization,
                        rht: false,
                        stochastic_rounding: false,
                    }
                } else {
                    QuantizerSpec::Nvfp4 {
                        block_2d: false,
                        rht: !c.disable_rht,
                        stochastic_rounding: !forward && !c.disable_stochastic_rounding,
                    }
                }
            }
            Recipe::Bf16 => QuantizerSpec::identity_bf16(),
            Recipe::Custom(c) => c.quantizer(role).clone(),
        }
    }

    /// Resolves every slot of a module.
    pub fn resolve(&self, layout: &SlotLayout) -> Result<ModuleQuantizers> {
        let mut quantizers = resolve_slots(layout, |role, pass, index| {
            self.quantizer(role, pass, index)
        })?;
        quantizers.split_accumulator = self.split_accumulator();
        Ok(quantizers)
    }

    /// How this recipe's FP8 per-tensor GEMMs accumulate.
    pub fn split_accumulator(&self) -> SplitAccumulator {
        match self {
            Recipe::CurrentScaling(c) => {
                SplitAccumulator::from_params(c.fp8_gemm_fprop, c.fp8_gemm_dgrad, c.fp8_gemm_wgrad)
            }
            _ => SplitAccumulator::default(),
        }
    }
}

fn epsilon(value: f32, path: &str) -> Result<()> {
    if value.is_finite() && value >= 0.0 {
        Ok(())
    } else {
        Err(LowpError::invalid(path, value, "must be finite and >= 0"))
    }
}

/// Resolves a module's slots with a factory (a recipe, or a Rust closure: the programmatic twin
/// of a custom recipe, `|role, pass, index| -> QuantizerSpec`), then checks what TE checks when it
/// builds a module's quantizers: each quantizer's own rules, that every delayed-scaling request of
/// the module agrees (they share one state), and that no GEMM takes two 128x128-block operands.
pub fn resolve_slots(
    layout: &SlotLayout,
    factory: impl Fn(Option<&QuantizerRole>, Pass, usize) -> QuantizerSpec,
) -> Result<ModuleQuantizers> {
    let mut warnings = Vec::new();
    let mut delayed: Option<DelayedScalingConfig> = None;
    let mut resolve = |roles: &[Option<QuantizerRole>], pass: Pass| -> Result<Vec<SlotQuantizer>> {
        let label = if pass == Pass::Forward {
            "forward"
        } else {
            "backward"
        };
        roles
            .iter()
            .enumerate()
            .map(|(index, role)| {
                let spec = factory(role.as_ref(), pass, index);
                let tensor_type = slot_tensor_type(role.as_ref(), pass, index).to_string();
                let path = format!("{} {label} slot {index} ({})", layout.name, role.as_ref().map(|r| r.to_string()).unwrap_or_else(|| "unset role".into()));
                spec.validate(&path)?;
                if let QuantizerSpec::Fp8Delayed(config) = &spec {
                    match &delayed {
                        Some(existing) if existing != config => {
                            return Err(LowpError::invalid(
                                path,
                                format!("{config:?}"),
                                format!("conflicts with the module's other delayed-scaling request {existing:?}; all must agree (they share one state)"),
                            ))
                        }
                        _ => delayed = Some(config.clone()),
                    }
                }
                if spec.uses_stochastic_rounding() && !tensor_type.starts_with("grad") {
                    warnings.push(format!("{path}: NVFP4 stochastic rounding on a `{tensor_type}` slot; TE applies it to gradients only"));
                }
                Ok(SlotQuantizer {
                    role: role.clone(),
                    tensor_type,
                    spec,
                })
            })
            .collect()
    };
    let forward = resolve(&layout.forward, Pass::Forward)?;
    let backward = resolve(&layout.backward, Pass::Backward)?;
    let quantizers = ModuleQuantizers {
        forward,
        backward,
        delayed,
        split_accumulator: SplitAccumulator::default(),
        warnings,
    };
    check_no_2d_by_2d(layout, &quantizers)?;
    Ok(quantizers)
}

/// The representation side of `spec` a GEMM reads (a hybrid's rowwise or columnwise quantizer).
fn side(spec: &QuantizerSpec, columnwise: bool) -> &QuantizerSpec {
    match spec {
        QuantizerSpec::Hybrid {
            rowwise,
            columnwise: col,
            ..
        } => {
            if columnwise {
                col
            } else {
                rowwise
            }
        }
        other => other,
    }
}

fn is_2d_block(spec: &QuantizerSpec) -> bool {
    matches!(
        spec,
        QuantizerSpec::Fp8Block {
            block: BlockShape::OneTwentyEightSquare,
            ..
        }
    )
}

/// TE forbids block-scaled GEMMs with two 128x128 operands: check fprop (X row, W row), dgrad
/// (dY row, W col) and wgrad (X col, dY col) of every GEMM of the module.
fn check_no_2d_by_2d(layout: &SlotLayout, q: &ModuleQuantizers) -> Result<()> {
    for gemm in layout.gemms() {
        let x = &q.forward[gemm.input].spec;
        let w = &q.forward[gemm.weight].spec;
        let dy = &q.backward[gemm.grad_output].spec;
        for (name, a, b) in [
            ("fprop", side(x, false), side(w, false)),
            ("dgrad", side(dy, false), side(w, true)),
            ("wgrad", side(x, true), side(dy, true)),
        ] {
            if is_2d_block(a) && is_2d_block(b) {
                return Err(LowpError::invalid(
                    format!("{} GEMM {} ({name})", layout.name, gemm.index),
                    "128x128 x 128x128",
                    "a block-scaled GEMM takes at most one 128x128-block operand",
                ));
            }
        }
    }
    Ok(())
}

/// Slot indices of one GEMM's operands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GemmSlots {
    pub index: usize,
    /// Forward slot of the input (X).
    pub input: usize,
    /// Forward slot of the weight (W).
    pub weight: usize,
    /// Backward slot of the output gradient (dY).
    pub grad_output: usize,
}

impl SlotLayout {
    /// The GEMMs of the module and the slots of their operands.
    pub fn gemms(&self) -> Vec<GemmSlots> {
        match self.kind {
            super::role::ModuleKind::LayerNormMlp => vec![
                GemmSlots {
                    index: 0,
                    input: 0,
                    weight: 1,
                    grad_output: 0,
                },
                GemmSlots {
                    index: 1,
                    input: 3,
                    weight: 4,
                    grad_output: 2,
                },
            ],
            _ => (0..self.backward.len() / 2)
                .map(|g| GemmSlots {
                    index: g,
                    input: 3 * g,
                    weight: 3 * g + 1,
                    grad_output: 2 * g,
                })
                .collect(),
        }
    }
}

impl ModuleQuantizers {
    /// Checks, when a module is built, that its shapes suit its quantizers: each GEMM's weight
    /// `[out_features, in_features]` whole, and the feature (last) dimension of its input
    /// (`in_features`) and output gradient (`out_features`). Token counts are checked per call.
    /// `features[g]` is GEMM g's `(out_features, in_features)`.
    pub fn check_gemm_shapes(
        &self,
        layout: &SlotLayout,
        features: &[(usize, usize)],
    ) -> Result<()> {
        for (gemm, &(out_features, in_features)) in layout.gemms().iter().zip(features) {
            let weight = &self.forward[gemm.weight];
            let name = |slot: &SlotQuantizer| {
                slot.role
                    .as_ref()
                    .map(|r| r.to_string())
                    .unwrap_or_else(|| layout.name.clone())
            };
            for format in weight.spec.formats() {
                crate::format::check_shape(
                    &format!("{} weight", name(weight)),
                    out_features,
                    in_features,
                    &format,
                )?;
            }
            // Rows of activations and gradients are tokens: any multiple of the block will do here.
            for (slot, cols) in [
                (&self.forward[gemm.input], in_features),
                (&self.backward[gemm.grad_output], out_features),
            ] {
                for format in slot.spec.formats() {
                    crate::format::check_shape(
                        &format!("{} {}", name(slot), slot.tensor_type),
                        128,
                        cols,
                        &format,
                    )?;
                }
            }
        }
        Ok(())
    }
}
