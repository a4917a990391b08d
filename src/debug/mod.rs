//! Precision debugging (TE's debug tools and AutoswitchGemm): a debug config file selects layers
//! and features (`config`), a session installed on the training thread applies them and logs
//! statistics (`session`), computed on the device in one pass per tensor (`stats`); AutoswitchGemm
//! decides per (layer, GEMM) when to run in high precision (`autoswitch`); `summary` reads a run's
//! logs back.

pub mod autoswitch;
pub mod config;
pub mod layer;
mod read_batch;
pub mod session;
pub mod stats;
mod stats_logger;
pub mod summary;

pub use config::{DebugConfig, GemmName, TensorKind};
pub use layer::{GemmMode, LayerDebug, Operand};
pub use session::{DebugSession, Installed, SwitchRecord, SwitchTally};
pub use stats::{QuantizationError, TensorStats};
pub use summary::DebugSummary;
