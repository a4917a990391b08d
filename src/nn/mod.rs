//! Burn modules whose GEMMs run quantized: `Linear`, `LayerNormLinear`, `LayerNormMlp`,
//! `GroupedLinear`; conversions from and to burn-nn's modules (`burn_nn`), and the export of
//! their weights, quantized, as plain burn-nn `Linear` records (`quantized_export`).

pub mod burn_nn;
pub mod fused;
pub mod grouped_linear;
pub mod layernorm_linear;
pub mod layernorm_mlp;
pub mod linear;
pub mod lowp_state;
pub mod quantized_export;
pub mod rotary;
pub mod weight_cache;

pub use grouped_linear::{GroupedLinear, GroupedLinearConfig};
pub use layernorm_linear::{LayerNormLinear, LayerNormLinearConfig, Normalization};
pub use layernorm_mlp::{LayerNormMlp, LayerNormMlpConfig};
pub use linear::{Linear, LinearConfig};
pub use lowp_state::LowpState;
pub use quantized_export::{export_linear, LinearRecordData, QuantizedLinearExport};
