//! The optimizer step:
//! - `adamw`: one AdamW step of a parameter in one kernel (clipping, moments, decay, update);
//! - `sum_squares`: `Σ x²` of a gradient, for the clipping norm.

pub mod adamw;
pub mod sum_squares;
