//! What every kernel family shares:
//! - host side: the error launchers return (`error`), the matrices they take (`matrix`), device
//!   buffers and the small kernels that fill and copy them (`buffers`, `zeroed`), cube counts
//!   (`grid`), and the stream flags that order CubeCL's stream against cuBLASLt's
//!   (`stream_flags`);
//! - in kernels: element kinds and how raw words are read (`elements`), element pairs
//!   (`pairs`), cube-wide reductions (`reduce`), and blocked column sums' last step
//!   (`partial_sums`).

pub mod buffers;
pub mod elements;
pub mod error;
pub mod grid;
pub mod matrix;
pub mod pairs;
pub mod partial_sums;
pub mod reduce;
pub mod stream_flags;
pub mod zeroed;
