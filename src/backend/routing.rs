//! The signature type of the routing ops (`RoutingOps`): where every assignment of an MoE batch
//! sits in the experts' aligned batch, and back.

use burn::tensor::ops::IntTensor;

use super::LowpBackend;

/// Where every assignment of a batch sits in the experts' aligned batch, and back.
#[derive(Debug, Clone)]
pub struct TokenRoutes<B: LowpBackend> {
    pub tokens: usize,
    pub top_k: usize,
    /// Rows of the aligned batch.
    pub rows: usize,
    /// The aligned row of each assignment `[T·k]`.
    pub assignment_row: IntTensor<B>,
    /// The assignment of each aligned row, `T·k` for rows without one (padding, tail) `[rows]`.
    pub row_assignment: IntTensor<B>,
    /// The token of each aligned row, `T` for rows without one `[rows]`.
    pub row_token: IntTensor<B>,
}
