//! The reference quantizers (`burn_lowp::format`): golden vectors, codecs, properties.

mod common;

#[path = "format/codecs.rs"]
mod codecs;
#[path = "format/goldens.rs"]
mod goldens;
#[path = "format/properties.rs"]
mod properties;
#[path = "format/stochastic.rs"]
mod stochastic;
