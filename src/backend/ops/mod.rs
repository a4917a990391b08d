//! The ops traits `LowpBackend` is made of, one per concern and one file each, every method of a
//! trait named with its prefix: `LowpTypes` (the device byte buffer), `BytesOps` (`bytes_*`),
//! `QuantizeOps` (`quantize_*`), `GemmOps` (`gemm_*`), `GroupedOps` (`grouped_*`), `RoutingOps`
//! (`route_*`), `NormOps` (`norm_*`), `ActivationOps` (`act_*`), `AttentionOps` (`attention_*`),
//! `OptimOps` (`optim_*`) and `StatsOps` (`stats_*`). As in Burn's `backend::ops`, each trait
//! takes the backend as a parameter (`GemmOps<B: LowpBackend>`), so that a default body calls any
//! op of `B`; each default's Burn-op reference is in the trait's file, below the trait
//! (`rows.rs`: the row reductions several of them share).

pub mod activation;
pub mod attention;
pub mod bytes;
pub mod gemm;
pub mod grouped;
pub mod norm;
pub mod optim;
pub mod quantize;
pub mod routing;
pub mod rows;
pub mod stats;
pub mod types;

pub use activation::ActivationOps;
pub use attention::AttentionOps;
pub use bytes::BytesOps;
pub use gemm::GemmOps;
pub use grouped::GroupedOps;
pub use norm::NormOps;
pub use optim::OptimOps;
pub use quantize::QuantizeOps;
pub use routing::RoutingOps;
pub use stats::StatsOps;
pub use types::LowpTypes;
