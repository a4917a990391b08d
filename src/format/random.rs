//! The counter-based random generator behind NVFP4 stochastic rounding.
//!
//! TE draws Philox4x32 bits; burn-lowp uses a generator built from 32-bit integer multiplies, xors
//! and shifts only, so every CubeCL runtime (Vulkan included) reproduces it exactly. The bits for an
//! element depend only on `(seed, stream, element index)`: any kernel launch shape, or this
//! reference, gives the same bytes. Four elements share one 32-bit draw, 8 bits each, as TE's
//! software path does (`rbits`, `rbits >> 8`, `rbits >> 16`, `rbits >> 24`).

/// Stream of the rowwise representation.
pub const ROWWISE_STREAM: u32 = 0;
/// Stream of the columnwise representation (independent of the rowwise one, as in TE).
pub const COLUMNWISE_STREAM: u32 = 1;

/// A 32-bit avalanche mix (Wellons' "lowbias32"): a bijection with good bit diffusion.
pub fn mix32(mut x: u32) -> u32 {
    x ^= x >> 16;
    x = x.wrapping_mul(0x7FEB_352D);
    x ^= x >> 15;
    x = x.wrapping_mul(0x846C_A68B);
    x ^= x >> 16;
    x
}

/// The per-(seed, stream) key.
pub fn stream_key(seed: u64, stream: u32) -> u32 {
    let (low, high) = (seed as u32, (seed >> 32) as u32);
    mix32(low ^ mix32(high ^ stream.wrapping_mul(0x9E37_79B9).wrapping_add(0x85EB_CA6B)))
}

/// 32 random bits for draw number `counter` of a stream.
pub fn random_word(key: u32, counter: u32) -> u32 {
    mix32(mix32(counter ^ key).wrapping_add(key))
}

/// The 8 random bits of element `index` (element `index` uses byte `index % 4` of draw `index / 4`).
pub fn random_byte(key: u32, index: u32) -> u32 {
    (random_word(key, index / 4) >> (8 * (index % 4))) & 0xFF
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_are_roughly_uniform() {
        let key = stream_key(1234, ROWWISE_STREAM);
        let mut histogram = [0u32; 256];
        let n = 256 * 1000;
        for i in 0..n {
            histogram[random_byte(key, i) as usize] += 1;
        }
        // Each bin expects 1000 hits (std ~31.6); 6 sigma bounds.
        assert!(
            histogram.iter().all(|&h| (810..=1190).contains(&h)),
            "{histogram:?}"
        );
    }

    #[test]
    fn streams_and_seeds_differ() {
        let a = stream_key(7, ROWWISE_STREAM);
        let b = stream_key(7, COLUMNWISE_STREAM);
        let c = stream_key(8, ROWWISE_STREAM);
        let same = |k1: u32, k2: u32| {
            (0..1000)
                .filter(|&i| random_word(k1, i) == random_word(k2, i))
                .count()
        };
        assert_eq!(same(a, b), 0);
        assert_eq!(same(a, c), 0);
    }
}
