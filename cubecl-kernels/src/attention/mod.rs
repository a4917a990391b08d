//! Attention's elementwise passes, one kernel each way instead of Burn's chains of ops:
//! - `heads`: a fused QKV projection's rows split into per-head parts and merged back;
//! - `rope`: rotary position embedding (also applied by `heads` while it splits);
//! - `softmax`: the causal softmax and its gradient.

pub mod heads;
pub mod rope;
pub mod softmax;
