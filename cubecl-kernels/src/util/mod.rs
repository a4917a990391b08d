pub mod buffers;
pub mod pairs;
pub mod partial_sums;
pub mod reduce;
pub mod stream_flags;
pub mod zeroed;
