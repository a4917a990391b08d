pub mod act_fn;
pub mod activation;
pub mod dbias_amax;
pub mod norm;
