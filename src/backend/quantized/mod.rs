//! Quantized tensors on a backend (`QuantizedTensor` and its storages) and the delayed-scaling
//! state columns a cast reads and writes: the types the backend ops take and return, here so that
//! the backend needs nothing from the layers above it (`quant` re-exports them).

mod state_columns;
mod tensor;

pub(crate) use state_columns::last_column;
pub use state_columns::{AmaxHistoryColumns, ScaleColumns};
pub use tensor::{QuantizedStorage, QuantizedTensor, Storage, StorageScales};
