//! Rotary position embedding's frequency table, built on the host in f64 and rounded once to
//! the model's float dtype.
//!
//! Burn's `RotaryEncodingConfig::init` builds the table with tensor ops on the backend: on a
//! BF16 backend every step (the exponent, its reciprocal, the position product, cos and sin) is
//! rounded to BF16, and the angle `position · θ_i` alone is rounded to a BF16 ulp of itself, 1
//! rad at positions 128-255 (phase errors up to 0.76 rad were measured there). The table here is
//! the same layout (`freq_complex [max_seq, head, 2]`, row `2i + r` of a position holding
//! `[cos(p θ_i), sin(p θ_i)]` with `θ_i = theta^(-2i / head)`), computed in f64, stored as f32
//! and converted to the backend's float dtype when uploaded.

use burn::nn::{RotaryEncoding, RotaryEncodingConfig};
use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorData};

/// `θ_i = theta^(-2i / head)` for the `head / 2` pairs, in f64.
pub fn rotary_frequencies(head: usize, theta: f64) -> Vec<f64> {
    (0..head / 2)
        .map(|i| (-((2 * i) as f64) / head as f64 * theta.ln()).exp())
        .collect()
}

/// The table `[max_seq, head, 2]` in Burn's `freq_complex` layout, each entry the f64 value
/// rounded once to f32.
pub fn rotary_table(max_seq: usize, head: usize, theta: f64) -> Vec<f32> {
    let frequencies = rotary_frequencies(head, theta);
    let mut table = Vec::with_capacity(max_seq * head * 2);
    for position in 0..max_seq {
        for &frequency in &frequencies {
            let (sin, cos) = (position as f64 * frequency).sin_cos();
            // Both elements of a pair share the angle.
            for _ in 0..2 {
                table.push(cos as f32);
                table.push(sin as f32);
            }
        }
    }
    table
}

/// Burn's `RotaryEncoding` for `head`-wide heads and `max_seq` positions, with its table (and
/// `theta`, the frequencies) from [`rotary_table`] instead of the backend's tensor ops. Its
/// `forward` / `apply` and burn-lowp's RoPE ops use it as they use Burn's.
pub fn rotary_encoding<B: Backend>(
    max_seq: usize,
    head: usize,
    theta: f32,
    device: &B::Device,
) -> RotaryEncoding<B> {
    // Burn's own init (for the private start offset), then both tables replaced: building the
    // rounded one is a handful of launches once per model.
    let mut rope = RotaryEncodingConfig::new(max_seq, head).with_theta(theta).init::<B>(device);
    let table = TensorData::new(rotary_table(max_seq, head, theta as f64), [max_seq, head, 2]);
    rope.freq_complex = Tensor::from_data(table, device);
    let frequencies: Vec<f32> = rotary_frequencies(head, theta as f64).iter().map(|&f| f as f32).collect();
    rope.theta = Tensor::from_data(TensorData::new(frequencies, [head / 2]), device);
    rope
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every entry within half an f32 ulp of the f64 table (computed here independently, by
    /// angle = position · theta^(-2i/head) in f64), and once rounded to BF16, within half a BF16
    /// ulp of it: the f32 step adds at most 2^-24 relative, which the BF16 rounding can push
    /// across a tie only by that much.
    #[test]
    fn the_table_is_the_f64_table_rounded_once() {
        let (max_seq, head, theta) = (1024, 128, 10000.0);
        let table = rotary_table(max_seq, head, theta);
        let half_ulp = |v: f64, mantissa_bits: i32| {
            let exponent = v.abs().max(f64::MIN_POSITIVE).log2().floor() as i32;
            2f64.powi(exponent - mantissa_bits - 1)
        };
        let mut worst_bf16_phase = 0f64;
        for p in 0..max_seq {
            for j in 0..head {
                let i = j / 2;
                let angle = p as f64 * theta.powf(-(2.0 * i as f64) / head as f64);
                for (r, want) in [angle.cos(), angle.sin()].into_iter().enumerate() {
                    let got = table[(p * head + j) * 2 + r] as f64;
                    assert!((got - want).abs() <= half_ulp(want, 23) + 1e-300, "f32 at p {p} j {j} r {r}: {got} vs {want}");
                    let bf = half::bf16::from_f32(got as f32).to_f64();
                    let bound = half_ulp(want, 7) + want.abs() * 2f64.powi(-24);
                    assert!((bf - want).abs() <= bound + 1e-300, "bf16 at p {p} j {j} r {r}: {bf} vs {want}");
                }
                if j % 2 == 0 {
                    let (c, s) = (table[(p * head + j) * 2], table[(p * head + j) * 2 + 1]);
                    let (c, s) = (half::bf16::from_f32(c).to_f64(), half::bf16::from_f32(s).to_f64());
                    let phase = (s.atan2(c) - angle.sin().atan2(angle.cos())).abs();
                    worst_bf16_phase = worst_bf16_phase.max(phase.min(2.0 * std::f64::consts::PI - phase));
                }
            }
        }
        // BF16 cos and sin each within 2^-9: the rotation's phase within about 2^-8 rad at any
        // position (Burn's BF16-built table is off by up to 0.76 rad at positions 128-255).
        assert!(worst_bf16_phase < 0.008, "worst phase error {worst_bf16_phase}");
    }

    /// The layout is Burn's: the f32 table equals `RotaryEncodingConfig::init` on an f32 backend
    /// to within f32 rounding of Burn's f32 arithmetic.
    #[cfg(feature = "ndarray")]
    #[test]
    fn the_layout_is_burns() {
        use burn::backend::NdArray;
        let (max_seq, head) = (16, 8);
        let device = Default::default();
        let burns: Vec<f32> = RotaryEncodingConfig::new(max_seq, head)
            .init::<NdArray>(&device)
            .freq_complex
            .into_data()
            .to_vec()
            .unwrap();
        let ours: Vec<f32> = rotary_encoding::<NdArray>(max_seq, head, 10000.0, &device)
            .freq_complex
            .into_data()
            .to_vec()
            .unwrap();
        assert_eq!(burns.len(), ours.len());
        for (k, (a, b)) in burns.iter().zip(&ours).enumerate() {
            assert!((a - b).abs() < 2e-5, "entry {k}: Burn {a}, ours {b}");
        }
    }
}
