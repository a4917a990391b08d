//! Quantized tensors on a backend (`QuantizedTensor` and its storages) and the delayed-scaling
//! state columns a cast reads and writes: the types the backend ops take and return, here so that
//! the backend needs nothing from the layers above it (`quant` re-exports them). `burn_native`
//! converts storages to and from Burn's native quantized tensors; `parts` holds them as Burn
//! tensors (`QuantizedParts`: U8 codes, f32 or U8 scales) for every format.

pub mod burn_native;
mod parts;
mod state_columns;
mod tensor;

#[cfg(any(feature = "wgpu", feature = "cuda"))]
pub(crate) use state_columns::last_column;
pub use parts::{
    QuantizedParts, QuantizedPartsItem, QuantizedTensorParts, QuantizedTensorPartsItem, ScaleParts,
    ScalePartsItem,
};
pub use state_columns::{AmaxHistoryColumns, ScaleColumns};
pub use tensor::{QuantizedStorage, QuantizedTensor, Storage, StorageScales};
