pub mod heads;
pub mod rope;
pub mod softmax;
