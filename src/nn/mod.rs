//! Burn modules whose GEMMs run quantized: `Linear`, `LayerNormLinear`.

pub mod layernorm_linear;
pub mod linear;
pub mod lowp_state;
pub mod weight_cache;

pub use layernorm_linear::{LayerNormLinear, LayerNormLinearConfig, Normalization};
pub use linear::{Linear, LinearConfig};
pub use lowp_state::LowpState;
