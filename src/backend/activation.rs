//! LayerNormMLP's activation: TE's 12 names (spec section 10), their parameters, and how the CubeCL
//! kernels (`burn_lowp_kernels::activation`) compute each one, and what an activation pass returns
//! (`ActivationOutput`). In `backend` because the activation ops take them (`ActivationOps`); `ops`
//! and `nn` re-export the spec.

use std::fmt;
use std::str::FromStr;

use burn_lowp_kernels::activation::{ActFn, ActivationParams as KernelParams};
use serde::{Deserialize, Serialize};

use crate::error::LowpError;

/// TE's activation names. `*glu` variants are gated: fc1 writes `2 · ffn_hidden_size` columns,
/// `act(first half) · second half`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Activation {
    Gelu,
    Geglu,
    Glu,
    Qgelu,
    Qgeglu,
    Relu,
    Reglu,
    Srelu,
    Sreglu,
    Silu,
    Swiglu,
    ClampedSwiglu,
}

impl Activation {
    pub const ALL: [Activation; 12] = [
        Activation::Gelu,
        Activation::Geglu,
        Activation::Glu,
        Activation::Qgelu,
        Activation::Qgeglu,
        Activation::Relu,
        Activation::Reglu,
        Activation::Srelu,
        Activation::Sreglu,
        Activation::Silu,
        Activation::Swiglu,
        Activation::ClampedSwiglu,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Activation::Gelu => "gelu",
            Activation::Geglu => "geglu",
            Activation::Glu => "glu",
            Activation::Qgelu => "qgelu",
            Activation::Qgeglu => "qgeglu",
            Activation::Relu => "relu",
            Activation::Reglu => "reglu",
            Activation::Srelu => "srelu",
            Activation::Sreglu => "sreglu",
            Activation::Silu => "silu",
            Activation::Swiglu => "swiglu",
            Activation::ClampedSwiglu => "clamped_swiglu",
        }
    }

    /// Whether fc1 writes two halves (`act(a) · b`).
    pub fn is_gated(self) -> bool {
        matches!(
            self,
            Activation::Geglu
                | Activation::Glu
                | Activation::Qgeglu
                | Activation::Reglu
                | Activation::Sreglu
                | Activation::Swiglu
                | Activation::ClampedSwiglu
        )
    }

    /// The elementwise function (applied to the first half when gated).
    pub fn function(self) -> ActFn {
        match self {
            Activation::Gelu | Activation::Geglu => ActFn::Gelu,
            Activation::Glu => ActFn::Sigmoid,
            Activation::Qgelu | Activation::Qgeglu => ActFn::Qgelu,
            Activation::Relu | Activation::Reglu => ActFn::Relu,
            Activation::Srelu | Activation::Sreglu => ActFn::Srelu,
            Activation::Silu | Activation::Swiglu => ActFn::Silu,
            Activation::ClampedSwiglu => ActFn::ClampedSilu,
        }
    }
}

impl fmt::Display for Activation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Activation {
    type Err = LowpError;

    fn from_str(s: &str) -> Result<Self, LowpError> {
        Activation::ALL
            .into_iter()
            .find(|a| a.name() == s)
            .ok_or_else(|| {
                LowpError::invalid(
                    "activation",
                    format!("{s:?}"),
                    format!(
                        "must be one of {}",
                        Activation::ALL.map(|a| a.name()).join(", ")
                    ),
                )
            })
    }
}

/// TE's `activation_params`, used by clamped_swiglu: `min(a, limit) · σ(alpha · min(a, limit)) ·
/// (clamp(b, -limit, limit) + glu_linear_offset)`. (qgelu's 1.702 is fixed.)
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct ActivationParams {
    #[serde(default = "default_limit")]
    pub limit: f32,
    #[serde(default = "default_alpha")]
    pub alpha: f32,
    #[serde(default = "default_offset")]
    pub glu_linear_offset: f32,
}

fn default_limit() -> f32 {
    7.0
}
fn default_alpha() -> f32 {
    1.702
}
fn default_offset() -> f32 {
    1.0
}

impl Default for ActivationParams {
    fn default() -> Self {
        ActivationParams {
            limit: default_limit(),
            alpha: default_alpha(),
            glu_linear_offset: default_offset(),
        }
    }
}

/// An activation with its parameters, as the op and the backends take it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ActivationSpec {
    pub activation: Activation,
    pub params: ActivationParams,
}

impl ActivationSpec {
    /// The kernels' runtime parameters (qgelu's alpha is 1.702; the gate's limits are
    /// clamped_swiglu's alone).
    pub fn kernel_params(&self) -> KernelParams {
        match self.activation {
            Activation::ClampedSwiglu => KernelParams {
                alpha: self.params.alpha,
                limit: self.params.limit,
                offset: self.params.glu_linear_offset,
            },
            _ => KernelParams {
                alpha: 1.702,
                limit: f32::MAX,
                offset: 0.0,
            },
        }
    }

    /// Checks the parameters: a finite, positive limit and finite alpha and offset.
    pub fn check(&self) -> Result<(), LowpError> {
        let p = self.params;
        if self.activation == Activation::ClampedSwiglu
            && !(p.limit.is_finite() && p.limit > 0.0 && p.alpha.is_finite() && p.glu_linear_offset.is_finite())
        {
            return Err(LowpError::invalid(
                "activation_params",
                format!("{p:?}"),
                "clamped_swiglu needs a finite limit > 0 and finite alpha and glu_linear_offset",
            ));
        }
        Ok(())
    }
}

/// The activation's results: the output (or dh), its amax when fused, and (backward) the f32
/// bias gradient `Σ_rows dh`.
pub struct ActivationOutput<T, A> {
    pub y: T,
    pub amax: Option<A>,
    pub dbias: Option<T>,
}
