//! LayerNormMLP's normalization and activations, forward and backward, and a Linear's bias
//! gradient; each can take the amax of what it stores for the FP8 current-scaling cast that reads
//! it next:
//! - `norm`: LayerNorm / RMSNorm;
//! - `act_fn`: the activation functions and their derivatives; `activation`: their kernels;
//! - `dbias_amax`: a grad-output's column sums (the bias gradient) and amax in one read.

pub mod act_fn;
pub mod activation;
pub mod dbias_amax;
pub mod norm;
