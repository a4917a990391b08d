mod base;
mod handle;

pub use base::*;
pub use handle::*;
