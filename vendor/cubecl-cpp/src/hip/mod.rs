pub mod arch;
pub mod dialect;
mod extension;
pub mod processors;

pub use dialect::*;
use extension::*;
pub mod mma;
