//! Mixture-of-experts building blocks a model reuses: the router (softmax top-k or sigmoid with
//! an aux-loss-free bias, load-balancing and z losses), the device-side token routing
//! (`ops::token_routing`), the
//! experts as a SwiGLU MLP of `GroupedLinear`s, and the MoE layer that puts them together; then
//! a small MoE language model and what trains it (`cargo run --release --example moe_train`).

pub mod checkpoint;
pub mod command;
pub mod data;
pub mod experts;
pub mod host_profile;
pub mod layer;
pub mod model;
pub mod plot;
pub mod router;
pub mod run_config;
pub mod train;

pub use command::{read_summaries, results_table, run, MoeTrainArgs};
pub use data::{Batch, Corpus};
pub use experts::{SwigluExperts, SwigluExpertsConfig};
pub use layer::{MoeAux, MoeLayer, MoeLayerConfig, SwigluMlp};
pub use model::{CausalSelfAttention, MoeDecoderLayer, MoeLm, MoeLmConfig, MoeLmOutput};
pub use crate::ops::token_routing::{combine, dispatch, expert_positions, token_routes, top_k, TokenRoutes};
pub use router::{Router, RouterConfig, Routing, ScoreFunction};
pub use run_config::{RunConfig, TrainConfig};
pub use train::{train, RunSummary, StepMetrics, TrainRun};
