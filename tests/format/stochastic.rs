//! NVFP4 stochastic rounding has no golden: it is checked statistically and structurally.

use burn_lowp::format::codec::decode_e2m1;
use burn_lowp::format::nvfp4::{element_encode_scale, global_encode_scale};
use burn_lowp::format::{
    quantize_nvfp4, Direction, HostMatrix, InputDtype, Nvfp4Config, Scales, Usage,
};

use crate::common::random_matrix;

fn sr(seed: u64) -> Nvfp4Config {
    Nvfp4Config {
        block_2d: false,
        rht: false,
        stochastic_seed: Some(seed),
    }
}

const RN: Nvfp4Config = Nvfp4Config {
    block_2d: false,
    rht: false,
    stochastic_seed: None,
};

/// The E2M1 grid points just below and above |v| (equal when |v| is on the grid or >= 6).
fn neighbours(v: f32) -> (f32, f32) {
    let grid = [0.0f32, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0];
    let a = v.abs().min(6.0);
    let lower = *grid.iter().rev().find(|&&g| g <= a).unwrap();
    let upper = *grid.iter().find(|&&g| g >= a).unwrap();
    (lower, upper)
}

#[test]
fn same_seed_same_bytes_other_seed_other_bytes() {
    let x = random_matrix(64, 128, 11, 2.0);
    let a = quantize_nvfp4(&x, &sr(5), Usage::BOTH).unwrap();
    let b = quantize_nvfp4(&x, &sr(5), Usage::BOTH).unwrap();
    let c = quantize_nvfp4(&x, &sr(6), Usage::BOTH).unwrap();
    assert_eq!(a, b);
    assert_ne!(
        a.rowwise.as_ref().unwrap().codes,
        c.rowwise.as_ref().unwrap().codes
    );
    assert_ne!(
        a.columnwise.as_ref().unwrap().codes,
        c.columnwise.as_ref().unwrap().codes
    );
}

#[test]
fn only_the_two_neighbouring_grid_points_appear() {
    let x = random_matrix(128, 256, 12, 3.0);
    let q_sr = quantize_nvfp4(&x, &sr(99), Usage::ROWWISE).unwrap();
    let q_rn = quantize_nvfp4(&x, &RN, Usage::ROWWISE).unwrap();
    let (row_sr, row_rn) = (q_sr.rowwise.unwrap(), q_rn.rowwise.unwrap());
    assert_eq!(
        row_sr.scales, row_rn.scales,
        "stochastic rounding leaves the block scales alone"
    );
    let Scales::BlockBytes { shape, bytes, .. } = &row_sr.scales else {
        panic!()
    };
    let s_dec = 1.0 / global_encode_scale(row_sr.amax.unwrap());
    let (mut up, mut down) = (0, 0);
    for r in 0..x.rows {
        for c in 0..x.cols {
            let enc = element_encode_scale(bytes[r * shape[1] + c / 16], s_dec);
            let v = x.at(r, c) * enc;
            let idx = r * x.cols + c;
            let code = (row_sr.codes[idx / 2] >> (4 * (idx % 2))) & 0xF;
            let q = decode_e2m1(code);
            let (lo, hi) = neighbours(v);
            assert!(
                q.abs() == lo || q.abs() == hi,
                "v = {v}: got {q}, neighbours {lo}, {hi}"
            );
            assert!(q == 0.0 || (q < 0.0) == (v < 0.0), "sign of {v} lost: {q}");
            if lo != hi {
                if q.abs() == hi {
                    up += 1
                } else {
                    down += 1
                }
            }
        }
    }
    assert!(
        up > 1000 && down > 1000,
        "both directions occur: up {up}, down {down}"
    );
}

#[test]
fn rounding_is_unbiased_on_average() {
    // Blocks of 16: one element of 6 pins the block scale (global amax 6 -> S_enc 448 -> block
    // scale 448), the other 15 hold the value under test, so x * enc ~= x.
    for target in [0.1f32, 0.3, 1.3, 1.8, 2.7, 3.2, 4.9, 5.5, -3.3, -0.7] {
        let (rows, cols) = (256, 1024);
        let values: Vec<f32> = (0..rows * cols)
            .map(|i| if i % 16 == 0 { 6.0 } else { target })
            .collect();
        let x = HostMatrix::new("constant", rows, cols, InputDtype::F32, values).unwrap();
        let q = quantize_nvfp4(&x, &sr(target.to_bits() as u64), Usage::ROWWISE).unwrap();
        let dq = q.dequantize(Direction::Rowwise).unwrap();
        let samples: Vec<f64> = dq
            .iter()
            .enumerate()
            .filter(|(i, _)| i % 16 != 0)
            .map(|(_, &v)| v as f64)
            .collect();
        let mean = samples.iter().sum::<f64>() / samples.len() as f64;
        let (lo, hi) = neighbours(target);
        let step = (hi - lo) as f64;
        // Standard error of the mean is at most step/2/sqrt(n); the 8-bit random draw adds a
        // bias of at most step/256.
        let tolerance = 6.0 * step * 0.5 / (samples.len() as f64).sqrt() + step / 256.0 + 1e-6;
        assert!(
            (mean - target as f64).abs() <= tolerance,
            "target {target}: mean {mean}, tolerance {tolerance}"
        );
    }
}
