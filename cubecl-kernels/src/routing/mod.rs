//! An MoE layer's token routing on the device, in a handful of launches instead of some forty
//! Burn tensor ops per layer: the router's top-k choice, a stable counting sort of the `T·k`
//! assignments by expert (every assignment's position in the packed batch, and the experts' token
//! counts, the grouped GEMMs' `m_splits`), every assignment's row in the experts' aligned batch,
//! and the moves of token rows into that batch (dispatch, a row gather elsewhere) and back
//! (combine: each token's k expert rows weighted by the router and summed in f32).
//!
//! Assignment `a = t·k + j` is token t's j-th choice. Host references:
//! `burn_lowp::ops::token_routing` (Burn tensor ops, the default of every other backend).
//!
//! One file per step, each kernel beside its launcher:
//! * `top_k`: the router's choice of k experts per token;
//! * `expert_positions`: the counting sort of the assignments by expert, with `m_splits`;
//! * `route_rows`: every assignment's row in the aligned batch, and each row's assignment;
//! * `combine_rows`: the weighted sum of each token's expert rows, and its gradients.
//!
//! Expert indices are the top-k kernel's, in `0..experts`; an index outside that range is not
//! counted and its assignment gets row `rows` (nothing reads or writes it), so a bad index can
//! never send a kernel out of bounds.

use crate::util::error::KernelError;

pub mod combine_rows;
pub mod expert_positions;
pub mod route_rows;
pub mod top_k;

/// Units per cube of the sorting kernels (assignments per chunk).
pub const ROUTE_UNITS: usize = 256;
/// Units per cube of the row kernels (one cube per row, units over column pairs).
pub const ROW_UNITS: usize = 128;
/// The most experts the scan kernel's shared memory holds.
pub const MAX_EXPERTS: usize = 1024;

/// The error of a shape or count the routing kernels cannot take.
pub(crate) fn too_large(what: String, rule: &str) -> KernelError {
    KernelError {
        value: what,
        rule: rule.to_string(),
    }
}

/// The row kernels' shape rule: whole column pairs, indexable in 32 bits.
pub(crate) fn require_pairs(what: &str, rows: usize, cols: usize) -> Result<(), KernelError> {
    if cols % 2 != 0 || rows * cols >= u32::MAX as usize {
        return Err(too_large(
            format!("{what} [{rows}, {cols}]"),
            "the routing kernels take an even number of columns and fewer than 2^32 elements",
        ));
    }
    Ok(())
}

