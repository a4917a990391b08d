//! The matrices launchers take: a contiguous row-major `[rows, cols]` tensor in device memory,
//! read as raw 32-bit words whatever its element type (`ElemKind`). `InputMatrix` is the
//! quantize-family input (read as 4-word vectors, its dimensions checked against the format's
//! blocks); `WordMatrix` the input of the element-pair kernels (norm, activation, attention,
//! routing), whose last word may hold one element.

use cubecl::prelude::*;
use cubecl::server::Handle;

use crate::util::buffers::arg;
use crate::util::elements::ElemKind;
use crate::util::error::{require, KernelError};

/// Inputs are read as vectors of 4 words (16 bytes).
pub(crate) const INPUT_VECTOR: usize = 4;

/// A contiguous row-major `[rows, cols]` input matrix in device memory.
#[derive(Clone, Copy)]
pub struct InputMatrix<'a> {
    pub handle: &'a Handle,
    pub rows: usize,
    pub cols: usize,
    pub kind: ElemKind,
}

impl InputMatrix<'_> {
    pub(crate) fn words(&self) -> usize {
        self.rows * self.cols * self.kind.bytes() / 4
    }

    pub(crate) fn arg<R: Runtime>(&self) -> ArrayArg<R> {
        unsafe { ArrayArg::from_raw_parts(self.handle.clone(), self.words()) }
    }

    /// Both dimensions must be multiples of `row_block` / `col_block` (and non-zero).
    pub(crate) fn require_blocks(
        &self,
        row_block: usize,
        col_block: usize,
        format: &str,
    ) -> Result<(), KernelError> {
        require(
            self.rows > 0 && self.cols > 0,
            format!("shape [{}, {}]", self.rows, self.cols),
            format!("{format} needs a non-empty matrix"),
        )?;
        require(
            self.cols % col_block == 0,
            format!("K = {}", self.cols),
            format!("{format} needs K divisible by {col_block}"),
        )?;
        require(
            self.rows % row_block == 0,
            format!("M = {}", self.rows),
            format!("{format} needs M divisible by {row_block}"),
        )?;
        require(
            self.rows * self.cols < u32::MAX as usize,
            format!("{} elements", self.rows * self.cols),
            "quantize kernels index elements with 32 bits",
        )
    }
}

/// A contiguous row-major matrix of raw words in device memory (the element-pair kernels).
#[derive(Clone, Copy)]
pub struct WordMatrix<'a> {
    pub handle: &'a Handle,
    pub rows: usize,
    pub cols: usize,
    pub kind: ElemKind,
}

impl WordMatrix<'_> {
    pub(crate) fn words(&self) -> usize {
        (self.rows * self.cols * self.kind.bytes()).div_ceil(4)
    }

    pub(crate) fn bytes(&self) -> usize {
        self.rows * self.cols * self.kind.bytes()
    }

    pub(crate) fn arg<R: Runtime>(&self) -> ArrayArg<R> {
        arg(self.handle, self.words())
    }
}

/// The element-pair kernels' shape rule: a non-empty matrix of whole pairs, indexable in 32 bits.
pub(crate) fn require_pairs(x: &WordMatrix, what: &str) -> Result<(), KernelError> {
    if x.rows == 0 || x.cols == 0 || x.cols % 2 != 0 || x.rows * x.cols >= u32::MAX as usize {
        return Err(KernelError {
            value: format!("{what} [{}, {}]", x.rows, x.cols),
            rule: "LayerNormMLP kernels take non-empty matrices with an even number of columns \
                   and fewer than 2^32 elements"
                .to_string(),
        });
    }
    Ok(())
}
