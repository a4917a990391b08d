//! Mixture-of-experts building blocks a model reuses: the router (softmax top-k or sigmoid with
//! an aux-loss-free bias, load-balancing and z losses), the device-side token routing
//! (`ops::token_routing`), the
//! experts as a SwiGLU MLP of `GroupedLinear`s, and the MoE layer that puts them together; then
//! a small MoE language model built from them; `expert_parallel`: the layer and the model with
//! the experts spread over the ranks of an expert-parallel group. What trains it (run config, data, the training
//! loop, checkpoints, charts) is the example `examples/moe_train/`
//! (`cargo run --release --example moe_train`).

pub mod experts;
pub mod expert_parallel;
pub mod layer;
pub mod model;
pub mod router;

pub use experts::{SwigluExperts, SwigluExpertsConfig};
pub use layer::{MoeAux, MoeLayer, MoeLayerConfig, SwigluMlp};
pub use model::{CausalSelfAttention, MoeDecoderLayer, MoeLm, MoeLmConfig, MoeLmOutput};
pub use crate::ops::token_routing::{combine, dispatch, expert_positions, token_routes, top_k, TokenRoutes};
pub use router::{Router, RouterConfig, Routing, ScoreFunction};
