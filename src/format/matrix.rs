//! The host-side input of every reference quantizer: a row-major `[rows, cols]` matrix of values
//! (upcast to f32) that remembers the dtype they came from.

use crate::error::{LowpError, Result};

/// Element type of a high-precision source tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum InputDtype {
    F32,
    F16,
    BF16,
}

impl InputDtype {
    pub fn name(self) -> &'static str {
        match self {
            InputDtype::F32 => "f32",
            InputDtype::F16 => "f16",
            InputDtype::BF16 => "bf16",
        }
    }

    /// Largest finite value of the dtype (block scaling uses it when `fp8_max / amax` overflows).
    pub fn max_finite(self) -> f32 {
        match self {
            InputDtype::F32 => f32::MAX,
            InputDtype::F16 => half::f16::MAX.to_f32(),
            InputDtype::BF16 => half::bf16::MAX.to_f32(),
        }
    }

    /// Round an f32 to this dtype (nearest, ties to even) and back.
    pub fn round(self, x: f32) -> f32 {
        match self {
            InputDtype::F32 => x,
            InputDtype::F16 => half::f16::from_f32(x).to_f32(),
            InputDtype::BF16 => half::bf16::from_f32(x).to_f32(),
        }
    }
}

/// A row-major `[rows, cols]` matrix: any tensor flattened to 2D as `[prod(shape[..-1]), shape[-1]]`.
#[derive(Debug, Clone, PartialEq)]
pub struct HostMatrix {
    pub name: String,
    pub rows: usize,
    pub cols: usize,
    pub dtype: InputDtype,
    pub values: Vec<f32>,
}

impl HostMatrix {
    /// Wraps `values`; their number must be `rows * cols` and every value must be representable
    /// in `dtype` (it is when the values were upcast from it).
    pub fn new(
        name: impl Into<String>,
        rows: usize,
        cols: usize,
        dtype: InputDtype,
        values: Vec<f32>,
    ) -> Result<Self> {
        let name = name.into();
        if rows.checked_mul(cols) != Some(values.len()) {
            return Err(LowpError::shape(
                name,
                format!("{} values for a [{rows}, {cols}] matrix", values.len()),
                "a matrix holds rows * cols values",
            ));
        }
        Ok(HostMatrix {
            name,
            rows,
            cols,
            dtype,
            values,
        })
    }

    /// Flattens a tensor of any rank to 2D: `[prod(shape[..-1]), shape[-1]]` (a scalar is `[1, 1]`).
    pub fn from_shape(
        name: impl Into<String>,
        shape: &[usize],
        dtype: InputDtype,
        values: Vec<f32>,
    ) -> Result<Self> {
        let cols = shape.last().copied().unwrap_or(1);
        let rows = shape[..shape.len().saturating_sub(1)].iter().product();
        Self::new(name, rows, cols, dtype, values)
    }

    pub fn at(&self, row: usize, col: usize) -> f32 {
        self.values[row * self.cols + col]
    }

    /// The physical transpose `[cols, rows]`.
    pub fn transpose(&self) -> HostMatrix {
        HostMatrix {
            name: self.name.clone(),
            rows: self.cols,
            cols: self.rows,
            dtype: self.dtype,
            values: transpose(&self.values, self.rows, self.cols),
        }
    }

    /// Error unless `rows % row_block == 0` and `cols % col_block == 0`.
    pub fn require_blocks(&self, row_block: usize, col_block: usize, format: &str) -> Result<()> {
        if self.rows == 0 || self.cols == 0 {
            return Err(LowpError::shape(
                &self.name,
                format!("shape [{}, {}]", self.rows, self.cols),
                format!("{format} needs a non-empty matrix"),
            ));
        }
        if self.cols % col_block != 0 {
            return Err(LowpError::shape(
                &self.name,
                format!("K = {} (last dimension)", self.cols),
                format!("{format} needs K divisible by {col_block}"),
            ));
        }
        if self.rows % row_block != 0 {
            return Err(LowpError::shape(
                &self.name,
                format!("M = {} (product of the leading dimensions)", self.rows),
                format!("{format} needs M divisible by {row_block}"),
            ));
        }
        Ok(())
    }
}

/// Transposes a row-major `[rows, cols]` buffer.
pub fn transpose<T: Copy>(values: &[T], rows: usize, cols: usize) -> Vec<T> {
    let mut out = Vec::with_capacity(values.len());
    for c in 0..cols {
        for r in 0..rows {
            out.push(values[r * cols + c]);
        }
    }
    out
}
