//! `QuantizerSpec`: what one quantizer slot does, as read from a recipe file. Every format of
//! `format/`, plus identity (keep high precision), hybrid (one quantizer per direction) and the
//! FP8 delayed-scaling request, whose scale comes from its module's shared state.

use serde::{Deserialize, Serialize};

use crate::error::{LowpError, Result};
use crate::format::fp8_block::BlockShape;
use crate::format::{
    FormatConfig, Fp8BlockScaling, Fp8CurrentScaling, Fp8Format, Mxfp8Config, Nvfp4Config,
};
use crate::quant::delayed::DelayedScalingConfig;

fn e4m3() -> Fp8Format {
    Fp8Format::E4M3
}

fn yes() -> bool {
    true
}

/// High-precision dtype an identity quantizer keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum IdentityDtype {
    #[default]
    Bf16,
    F16,
    F32,
}

/// Where a hybrid quantizer's columnwise copy is quantized from (TE PR #2817).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum ColumnwiseSource {
    /// The high-precision input (TE's default).
    #[default]
    Original,
    /// `dequantize(rowwise)`, so that forward and backward see consistent values ("double
    /// quantization"); recommended for inputs and weights, never for gradients.
    RowwiseDequantized,
}

/// One quantizer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "format", rename_all = "snake_case", deny_unknown_fields)]
pub enum QuantizerSpec {
    /// FP8 per-tensor, scale from this tensor's amax.
    Fp8Current {
        fp8: Fp8Format,
        #[serde(default)]
        pow2_scales: bool,
        #[serde(default)]
        amax_epsilon: f32,
    },
    /// FP8 per-tensor with delayed scaling: a request for the module's shared amax history and
    /// scale (TE's `DelayedScalingRequest`); all requests of a module must agree.
    Fp8Delayed(DelayedScalingConfig),
    /// FP8 with f32 scales per 1x128 block or 128x128 tile.
    Fp8Block {
        #[serde(default = "e4m3")]
        fp8: Fp8Format,
        block: BlockShape,
        #[serde(default = "yes")]
        pow2_scales: bool,
        #[serde(default)]
        amax_epsilon: f32,
    },
    /// MXFP8: E8M0 scales per 32 elements (or 32x32 tile).
    Mxfp8 {
        #[serde(default = "e4m3")]
        fp8: Fp8Format,
        #[serde(default)]
        block_2d: bool,
    },
    /// NVFP4: E4M3 scales per 16 elements (or 16x16 tile), global f32 scale.
    Nvfp4 {
        #[serde(default)]
        block_2d: bool,
        #[serde(default)]
        rht: bool,
        #[serde(default)]
        stochastic_rounding: bool,
    },
    /// No quantization: the tensor is kept in `dtype` and the GEMM runs in high precision.
    Identity {
        #[serde(default)]
        dtype: IdentityDtype,
    },
    /// One quantizer for the rowwise copy, another for the columnwise copy.
    Hybrid {
        rowwise: Box<QuantizerSpec>,
        columnwise: Box<QuantizerSpec>,
        #[serde(default)]
        columnwise_source: ColumnwiseSource,
    },
}

impl QuantizerSpec {
    pub fn identity_bf16() -> Self {
        QuantizerSpec::Identity {
            dtype: IdentityDtype::Bf16,
        }
    }

    /// A short human name (`mxfp8-e4m3`, `hybrid(mxfp8-e4m3, nvfp4-rht-sr)`, ...).
    pub fn name(&self) -> String {
        match self {
            QuantizerSpec::Fp8Delayed(c) => format!("fp8-delayed-{}", c.fp8_format.name()),
            QuantizerSpec::Identity { dtype } => format!("identity-{dtype:?}").to_lowercase(),
            QuantizerSpec::Hybrid {
                rowwise,
                columnwise,
                ..
            } => {
                format!("hybrid({}, {})", rowwise.name(), columnwise.name())
            }
            other => other
                .format_config(None)
                .map(|c| c.format().name())
                .unwrap_or_else(|_| "invalid".to_string()),
        }
    }

    /// The format configuration of a plain (not identity, hybrid or delayed) quantizer; `seed`
    /// is the stochastic-rounding seed of this call.
    pub fn format_config(&self, seed: Option<u64>) -> Result<FormatConfig> {
        Ok(match *self {
            QuantizerSpec::Fp8Current { fp8, pow2_scales, amax_epsilon } => FormatConfig::Fp8Current(Fp8CurrentScaling {
                fp8,
                pow2_scales,
                amax_epsilon,
            }),
            QuantizerSpec::Fp8Block { fp8, block, pow2_scales, amax_epsilon } => FormatConfig::Fp8Block(Fp8BlockScaling {
                fp8,
                block,
                pow2_scales,
                amax_epsilon,
            }),
            QuantizerSpec::Mxfp8 { fp8, block_2d } => FormatConfig::Mxfp8(Mxfp8Config { fp8, block_2d }),
            QuantizerSpec::Nvfp4 { block_2d, rht, stochastic_rounding } => FormatConfig::Nvfp4(Nvfp4Config {
                block_2d,
                rht,
                stochastic_seed: stochastic_rounding.then(|| seed.unwrap_or(0)),
            }),
            ref other => {
                return Err(LowpError::invalid(
                    "quantizer",
                    other.name(),
                    "has no single format (identity, hybrid and delayed quantizers are handled by the caller)",
                ))
            }
        })
    }

    /// Checks the rules TE enforces on one quantizer, naming `path` (a JSON path) in errors:
    /// no pure-E5M2 training, no hybrid inside a hybrid, no delayed request inside a hybrid,
    /// no 16x16 NVFP4 with RHT, finite non-negative epsilons.
    pub fn validate(&self, path: &str) -> Result<()> {
        match self {
            QuantizerSpec::Fp8Current { amax_epsilon, .. } | QuantizerSpec::Fp8Block { amax_epsilon, .. } => {
                if !(amax_epsilon.is_finite() && *amax_epsilon >= 0.0) {
                    return Err(LowpError::invalid(format!("{path}.amax_epsilon"), amax_epsilon, "must be finite and >= 0"));
                }
            }
            QuantizerSpec::Fp8Delayed(config) => config.validate(path)?,
            QuantizerSpec::Nvfp4 { block_2d: true, rht: true, .. } => {
                return Err(LowpError::invalid(
                    format!("{path}.rht"),
                    true,
                    "NVFP4 applies RHT to 1x16 activations and gradients; 16x16 blocks (weights) take none",
                ))
            }
            QuantizerSpec::Hybrid { rowwise, columnwise, .. } => {
                for (side, spec) in [("rowwise", rowwise), ("columnwise", columnwise)] {
                    let side_path = format!("{path}.{side}");
                    match spec.as_ref() {
                        QuantizerSpec::Hybrid { .. } => {
                            return Err(LowpError::invalid(side_path, spec.name(), "a hybrid quantizer's sides must not be hybrid"))
                        }
                        QuantizerSpec::Fp8Delayed(_) => {
                            return Err(LowpError::invalid(
                                side_path,
                                spec.name(),
                                "a delayed-scaling request cannot sit inside a hybrid quantizer (as in TE)",
                            ))
                        }
                        other => other.validate(&side_path)?,
                    }
                }
            }
            _ => {}
        }
        Ok(())
    }

    /// The formats this quantizer produces (both sides of a hybrid; none for identity; a delayed
    /// request as FP8 per-tensor).
    pub fn formats(&self) -> Vec<crate::format::QuantFormat> {
        match self {
            QuantizerSpec::Identity { .. } => Vec::new(),
            QuantizerSpec::Hybrid {
                rowwise,
                columnwise,
                ..
            } => {
                let mut f = rowwise.formats();
                f.extend(columnwise.formats());
                f
            }
            QuantizerSpec::Fp8Delayed(c) => vec![crate::format::QuantFormat::Fp8Tensor {
                fp8: c.fp8_format.element_format(true),
            }],
            plain => plain
                .format_config(None)
                .map(|c| vec![c.format()])
                .unwrap_or_default(),
        }
    }

    /// Errors unless a `[rows, cols]` tensor suits every format this quantizer produces.
    pub fn check_shape(&self, tensor: &str, rows: usize, cols: usize) -> Result<()> {
        for format in self.formats() {
            crate::format::check_shape(tensor, rows, cols, &format)?;
        }
        Ok(())
    }

    /// Whether this quantizer (or a side of it) rounds stochastically.
    pub fn uses_stochastic_rounding(&self) -> bool {
        match self {
            QuantizerSpec::Nvfp4 {
                stochastic_rounding,
                ..
            } => *stochastic_rounding,
            QuantizerSpec::Hybrid {
                rowwise,
                columnwise,
                ..
            } => rowwise.uses_stochastic_rounding() || columnwise.uses_stochastic_rounding(),
            _ => false,
        }
    }
}
