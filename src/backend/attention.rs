//! The signature types of attention's backend ops (`AttentionOps`): where the rows of a RoPE
//! input sit (`RopePositions`) and how token rows split into heads (`HeadLayout`, the kernels'
//! own type).

pub use burn_lowp_kernels::heads::HeadLayout;

/// Where the rows of a RoPE input sit: `x [rows, head]` holds whole sequences of `seq` rows,
/// row r at position `r % seq + start` of the frequency table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RopePositions {
    pub seq: usize,
    pub start: usize,
}
