//! `burn_lowp_kernels::optim::sum_squares` (the gradient norm of `FusedAdamW`'s clipping) against
//! an f64 sum on the host, on sizes from a few pairs to several loop steps of every unit (more
//! pairs than the first pass's units times the pairs each loads per step), in f32 and bf16 words.

use burn_lowp_kernels::util::elements::ElemKind;
use burn_lowp_kernels::cubecl::prelude::*;
use burn_lowp_kernels::optim::sum_squares::sum_squares;

use crate::common::read_words;

pub fn check_sum_squares<R: Runtime>(device: &R::Device) {
    let client = R::client(device);
    // 512 cubes x 256 units x 8 pairs in flight = 1 Mi pairs per step: the largest size takes
    // three steps and a partial fourth.
    for n in [2usize, 6, 1030, 4096 * 2 + 6, 2 * (3 * 1024 * 1024 + 12345)] {
        // Mixed signs and magnitudes (exact in bf16), against an f64 sum: f32 sums of positive
        // terms, the last level 512 partials added in order, stay within 1e-4.
        let mixed: Vec<f32> = (0..n)
            .map(|i| half::bf16::from_f32(((i * 2654435761usize) % 1021) as f32 / 64.0 - 8.0).to_f32())
            .collect();
        // ±1 and ±2 at every 97th element, zeros elsewhere: every partial sum is a small integer,
        // so the total is exact and one pair missed or counted twice shows.
        let sparse: Vec<f32> = (0..n)
            .map(|i| match (i % 97, (i / 97) % 4) {
                (0, 0) => 1.0,
                (0, 1) => -1.0,
                (0, 2) => 2.0,
                (0, 3) => -2.0,
                _ => 0.0,
            })
            .collect();
        for (name, values, tolerance) in [("mixed", &mixed, 1e-4), ("sparse", &sparse, 0.0)] {
            let expected: f64 = values.iter().map(|&v| (v as f64) * (v as f64)).sum();
            for kind in [ElemKind::F32, ElemKind::BF16] {
                let bytes: Vec<u8> = match kind {
                    ElemKind::BF16 => values.iter().flat_map(|&v| half::bf16::from_f32(v).to_le_bytes()).collect(),
                    _ => values.iter().flat_map(|&v| v.to_le_bytes()).collect(),
                };
                let input = client.create_from_slice(&bytes);
                let out = sum_squares(&client, &input, n, kind);
                let got = f32::from_bits(read_words(&client, &out, 1)[0]) as f64;
                assert!(
                    (got - expected).abs() <= tolerance * expected,
                    "sum of squares of {n} {name} {kind:?} values: {got} against {expected}"
                );
            }
        }
    }
}

macro_rules! sum_squares_suite {
    ($runtime:ty, $device:expr) => {
        #[test]
        fn sum_squares_matches_host_sum() {
            if let Some(d) = $device {
                crate::sum_squares::check_sum_squares::<$runtime>(&d);
            }
        }
    };
}
pub(crate) use sum_squares_suite;
