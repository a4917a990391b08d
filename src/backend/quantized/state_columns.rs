//! The columns of a module's delayed-scaling state that one cast reads (`ScaleColumns`, the
//! scales) or writes (`AmaxHistoryColumns`, row 0 of the amax history), named by index so that a
//! backend's cast reads them in place: the signature types of the delayed-scaling casts
//! (`QuantizeOps`, `GroupedOps`, `ActivationOps`).

use burn::tensor::backend::Backend;
use burn::tensor::ops::FloatTensor;

use crate::error::{LowpError, Result};

/// Row 0 of a module's delayed-scaling amax history `history [len, width]` (f32, columns one word
/// apart; rows may be pitched), where a cast on a backend with
/// `QuantizeOps::quantize_delayed_amax_in_place` folds its amaxes in its own launch: group g's (a
/// plain tensor's: g = 0) into column `first + g * stride`.
#[derive(Clone, Debug)]
pub struct AmaxHistoryColumns<B: Backend> {
    pub history: FloatTensor<B>,
    pub first: usize,
    pub stride: usize,
}

/// The last of `count` state columns `first + g * stride` (scales or history), or `None` for no
/// columns or an index past `usize`: one rule for every check of a cast's state columns.
pub(crate) fn last_column(first: usize, stride: usize, count: usize) -> Option<usize> {
    count.checked_sub(1)?.checked_mul(stride)?.checked_add(first)
}

/// The delayed-scaling scales a cast reads from a module's state `scales` (f32): group g's
/// (a plain tensor's: g = 0) is element `first + g * stride`. CubeBackend's cast reads it there
/// by index (a Burn slice at an unaligned offset, or a gather of the experts' scales, would be a
/// launch or an upload per cast); NdArray picks the values on the host.
#[derive(Clone, Debug)]
pub struct ScaleColumns<B: Backend> {
    pub scales: FloatTensor<B>,
    pub first: usize,
    pub stride: usize,
}

impl<B: Backend> ScaleColumns<B> {
    /// Every element of `scales`, in order (one per group).
    pub fn whole(scales: FloatTensor<B>) -> Self {
        ScaleColumns { scales, first: 0, stride: 1 }
    }

    /// Checks that `scales` is an f32 tensor (read in order, whatever its rank) holding the
    /// `count` columns, and returns their indices.
    pub fn indices(&self, count: usize) -> Result<Vec<usize>> {
        use burn::tensor::TensorMetadata;
        let shape = self.scales.shape();
        let dtype = self.scales.dtype();
        let holds = last_column(self.first, self.stride, count).is_some_and(|last| last < shape.num_elements());
        if dtype != burn::tensor::DType::F32 || !holds {
            return Err(LowpError::shape(
                "scales",
                format!(
                    "{dtype:?} {:?} read at {} + g * {} for {count} groups",
                    shape.as_slice(),
                    self.first,
                    self.stride
                ),
                "delayed-scaling scales are an f32 tensor holding every group's column",
            ));
        }
        Ok((0..count).map(|g| self.first + g * self.stride).collect())
    }
}
