//! `LowpBackend` for `NdArray`: the reference quantizers of `format` on the host. NdArray
//! tensors are f32, so inputs are quantized as f32 (an RHT copy is therefore kept in f32, not
//! rounded to bf16). Device bytes are shared host bytes (`HostBytes`). The ops with a host
//! implementation of their own have a file each (`bytes.rs`, `quantize.rs`, `gemm.rs`,
//! `grouped.rs`); routing, norm, activation, attention, the optimizer and statistics run the
//! traits' Burn-op defaults as they are (the empty impls below).

use std::sync::Arc;

use burn::backend::ndarray::NdArray;
use burn::tensor::ops::{FloatTensor, FloatTensorOps};
use burn::tensor::{read_sync, TensorMetadata};

use crate::backend::{
    matrix_dims, ScaleColumns, ActivationOps, AttentionOps, LowpBackend, LowpTypes, NormOps, OptimOps,
    RoutingOps, StatsOps,
};
use crate::error::{LowpError, Result};
use crate::format::{HostMatrix, InputDtype};

mod bytes;
mod gemm;
mod grouped;
mod quantize;

/// Host bytes shared between clones.
pub type HostBytes = Arc<Vec<u8>>;

impl LowpTypes for NdArray {
    type Bytes = HostBytes;
}

impl LowpBackend for NdArray {}

impl RoutingOps<Self> for NdArray {}
impl NormOps<Self> for NdArray {}
impl ActivationOps<Self> for NdArray {}
impl AttentionOps<Self> for NdArray {}
impl OptimOps<Self> for NdArray {}
impl StatsOps<Self> for NdArray {}

pub(crate) fn to_matrix(x: FloatTensor<NdArray>, name: &str) -> Result<HostMatrix> {
    let (rows, cols) = matrix_dims(&x.shape().as_slice());
    let data = read_sync(NdArray::<f32>::float_into_data(x))
        .map_err(|e| LowpError::invalid("tensor", name, format!("could not be read: {e:?}")))?;
    let values = data
        .convert::<f32>()
        .into_vec::<f32>()
        .map_err(|e| LowpError::invalid("tensor", name, format!("is not f32: {e:?}")))?;
    HostMatrix::new(name, rows, cols, InputDtype::F32, values)
}

pub(crate) fn upload(bytes: Vec<u8>) -> HostBytes {
    Arc::new(bytes)
}

/// The `count` scales a delayed cast reads (`ScaleColumns`), on the host.
pub(crate) fn scale_values(scales: ScaleColumns<NdArray>, count: usize) -> Result<Vec<f32>> {
    let indices = scales.indices(count)?;
    let values = to_matrix(scales.scales, "scales")?.values;
    Ok(indices.into_iter().map(|i| values[i]).collect())
}
