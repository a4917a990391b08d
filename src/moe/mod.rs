//! Mixture-of-experts building blocks a model reuses: the router (softmax top-k or sigmoid with
//! an aux-loss-free bias, load-balancing and z losses), the device-side token permutation, the
//! experts as a SwiGLU MLP of `GroupedLinear`s, and the MoE layer that puts them together.

pub mod experts;
pub mod layer;
pub mod permute;
pub mod router;

pub use experts::{SwigluExperts, SwigluExpertsConfig};
pub use layer::{MoeAux, MoeLayer, MoeLayerConfig, SwigluMlp};
pub use permute::{permutation, permute, unpermute, TokenPermutation};
pub use router::{top_k, Router, RouterConfig, Routing, ScoreFunction};
