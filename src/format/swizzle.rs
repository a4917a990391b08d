//! GEMM-swizzled block-scale layout (cuBLAS "block scaling factors layout", TE `swizzle.cu`).
//!
//! A compact scale matrix `S[R, C]` (rows = the GEMM operand's outer dimension, columns = scale
//! blocks along the contraction dimension) is zero-padded to `R % 128 == 0`, `C % 4 == 0` and cut
//! into 128x4 tiles of 512 bytes, stored tile after tile in row-major tile order. Inside a tile the
//! 128 rows are interleaved as 32 x 4: compact `(r, c)` goes to
//! `((r/128) * ceil(C/4) + c/4) * 512 + (r%32) * 16 + ((r%128)/32) * 4 + c%4`.

use super::mxfp8::round_up;
use crate::error::{LowpError, Result};

/// Byte offset of compact cell `(r, c)` in the swizzled buffer of a matrix with `cols` columns.
pub fn swizzled_offset(r: usize, c: usize, cols: usize) -> usize {
    let col_tiles = cols.div_ceil(4);
    ((r / 128) * col_tiles + c / 4) * 512 + (r % 32) * 16 + ((r % 128) / 32) * 4 + c % 4
}

/// The padded shape `[roundup(rows, 128), roundup(cols, 4)]` a swizzled buffer covers.
pub fn swizzled_shape(rows: usize, cols: usize) -> [usize; 2] {
    [round_up(rows, 128), round_up(cols, 4)]
}

/// Swizzles a row-major `[rows, cols]` compact matrix; cells beyond it (padding) are zero.
pub fn swizzle<T: Copy + Default>(compact: &[T], rows: usize, cols: usize) -> Result<Vec<T>> {
    check_len(compact.len(), rows, cols, "compact scales")?;
    let [pr, pc] = swizzled_shape(rows, cols);
    let mut out = vec![T::default(); pr * pc];
    for r in 0..rows {
        for c in 0..cols {
            out[swizzled_offset(r, c, pc)] = compact[r * cols + c];
        }
    }
    Ok(out)
}

/// Inverse of [`swizzle`]: returns the padded compact `[roundup(rows,128), roundup(cols,4)]` matrix.
pub fn unswizzle<T: Copy + Default>(swizzled: &[T], rows: usize, cols: usize) -> Result<Vec<T>> {
    let [pr, pc] = swizzled_shape(rows, cols);
    check_len(swizzled.len(), pr, pc, "swizzled scales")?;
    let mut out = vec![T::default(); pr * pc];
    for r in 0..pr {
        for c in 0..pc {
            out[r * pc + c] = swizzled[swizzled_offset(r, c, pc)];
        }
    }
    Ok(out)
}

fn check_len(len: usize, rows: usize, cols: usize, what: &str) -> Result<()> {
    if len != rows * cols {
        return Err(LowpError::shape(
            what,
            format!("{len} values"),
            format!("a [{rows}, {cols}] matrix holds {}", rows * cols),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_tile_row_order() {
        // Within a tile the 4-byte rows appear as 0, 32, 64, 96, 1, 33, ... (TE mxfp8.rst).
        let compact: Vec<u32> = (0..128 * 4).map(|i| i as u32).collect();
        let s = swizzle(&compact, 128, 4).unwrap();
        let row_order: Vec<u32> = s.chunks(4).take(8).map(|row| row[0] / 4).collect();
        assert_eq!(row_order, vec![0, 32, 64, 96, 1, 33, 65, 97]);
        assert_eq!(unswizzle(&s, 128, 4).unwrap(), compact);
    }
}
