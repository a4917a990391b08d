//! The random Hadamard transform (RHT) NVFP4 applies to the columnwise copy of activations and
//! gradients, the operands of the wgrad GEMM (TE `nvfp4_tensor.py::get_rht_matrix`).
//!
//! A 16-vector `v` maps to `v · diag(s) · H16 / 4`: flip signs with TE's fixed sign vector `s`,
//! then apply the Sylvester-ordered Hadamard matrix `H16[i][j] = (-1)^popcount(i & j)`, scaled by
//! `1/sqrt(16)`. Because the transform is orthogonal, it cancels in `dW = dYᵀX`.
//!
//! Arithmetic order: the transform runs as a 4-stage butterfly (fast Walsh-Hadamard) in f32, is
//! multiplied by 0.25 (exact) and rounded once to the input dtype, as TE's reference stores
//! `x @ RHT` in the input dtype. TE's reference sums the 16 products in a matmul whose order is not
//! specified, so a rare element may round differently there; the CubeCL kernel runs this exact order.

use super::matrix::InputDtype;

/// RHT block length.
pub const RHT_SIZE: usize = 16;

/// TE's sign vector as a mask: bit `i` is set where `s_i = -1`
/// (`s = [1,1,1,-1,1,-1,-1,-1,-1,-1,-1,1,-1,1,-1,-1]`).
pub const RHT_SIGN_MASK: u16 = 0xD7E8;

fn flip_signs(v: &mut [f32; RHT_SIZE]) {
    for (i, x) in v.iter_mut().enumerate() {
        if RHT_SIGN_MASK >> i & 1 == 1 {
            *x = -*x;
        }
    }
}

/// In-place unnormalised Walsh-Hadamard transform in Sylvester (natural) order.
fn walsh_hadamard(v: &mut [f32; RHT_SIZE]) {
    let mut h = 1;
    while h < RHT_SIZE {
        for start in (0..RHT_SIZE).step_by(2 * h) {
            for i in start..start + h {
                let (a, b) = (v[i], v[i + h]);
                v[i] = a + b;
                v[i + h] = a - b;
            }
        }
        h *= 2;
    }
}

/// `v · diag(s) · H16 / 4`, rounded to `dtype`.
pub fn rht16(v: &mut [f32; RHT_SIZE], dtype: InputDtype) {
    flip_signs(v);
    walsh_hadamard(v);
    for x in v.iter_mut() {
        *x = dtype.round(*x * 0.25);
    }
}

/// The inverse transform `w · H16 / 4 · diag(s)` in f32 (used to dequantize).
pub fn inverse_rht16(v: &mut [f32; RHT_SIZE]) {
    walsh_hadamard(v);
    for x in v.iter_mut() {
        *x *= 0.25;
    }
    flip_signs(v);
}

/// Applies `rht16` to every consecutive 16-element chunk of each row of a row-major matrix.
/// `cols` must be a multiple of 16.
pub fn rht_rows(values: &mut [f32], cols: usize, dtype: InputDtype) {
    debug_assert_eq!(cols % RHT_SIZE, 0);
    for chunk in values.chunks_exact_mut(RHT_SIZE) {
        let block: &mut [f32; RHT_SIZE] = chunk.try_into().expect("chunks_exact gives 16");
        rht16(block, dtype);
    }
}

/// Applies `inverse_rht16` to every 16-element chunk.
pub fn inverse_rht_rows(values: &mut [f32]) {
    for chunk in values.chunks_exact_mut(RHT_SIZE) {
        let block: &mut [f32; RHT_SIZE] = chunk.try_into().expect("chunks_exact gives 16");
        inverse_rht16(block);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The matrix `diag(s) · H16 / 4` written out from its definition.
    fn rht_matrix() -> [[f64; 16]; 16] {
        let signs = [
            1., 1., 1., -1., 1., -1., -1., -1., -1., -1., -1., 1., -1., 1., -1., -1.,
        ];
        let mut m = [[0.0; 16]; 16];
        for i in 0..16 {
            for j in 0..16 {
                let h = if (i & j as usize).count_ones() % 2 == 0 {
                    1.0
                } else {
                    -1.0
                };
                m[i][j] = signs[i] * h * 0.25;
            }
        }
        m
    }

    #[test]
    fn butterfly_equals_matrix_product() {
        let m = rht_matrix();
        let input: [f32; 16] =
            std::array::from_fn(|i| (i as f32 - 7.5) * 0.37 + (i * i) as f32 * 0.01);
        let mut v = input;
        rht16(&mut v, InputDtype::F32);
        for j in 0..16 {
            let expected: f64 = (0..16).map(|i| input[i] as f64 * m[i][j]).sum();
            assert!(
                (v[j] as f64 - expected).abs() < 1e-5,
                "j={j}: {} vs {expected}",
                v[j]
            );
        }
        inverse_rht16(&mut v);
        for i in 0..16 {
            assert!((v[i] - input[i]).abs() < 1e-5);
        }
    }

    #[test]
    fn sign_mask_matches_te_vector() {
        let signs = [1, 1, 1, -1, 1, -1, -1, -1, -1, -1, -1, 1, -1, 1, -1, -1];
        let mask = signs
            .iter()
            .enumerate()
            .fold(0u16, |m, (i, &s)| if s < 0 { m | 1 << i } else { m });
        assert_eq!(mask, RHT_SIGN_MASK);
    }
}
