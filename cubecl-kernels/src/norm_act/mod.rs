pub mod activation;
pub mod dbias_amax;
pub mod norm;
