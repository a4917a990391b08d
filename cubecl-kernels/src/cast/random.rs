//! The counter-based generator for NVFP4 stochastic rounding, in-kernel twin of
//! `burn_lowp::format::random`: 32-bit integer operations only. The per-(seed, direction) key is
//! derived on the host and passed in.

use cubecl::prelude::*;

/// Wellons' "lowbias32" avalanche mix (u32 multiplies wrap).
#[cube]
pub fn mix32(x: u32) -> u32 {
    let mut v = x;
    v ^= v >> 16u32;
    v *= 0x7FEB_352Du32;
    v ^= v >> 15u32;
    v *= 0x846C_A68Bu32;
    v ^= v >> 16u32;
    v
}

/// 32 random bits of draw `counter`.
#[cube]
pub fn random_word(key: u32, counter: u32) -> u32 {
    mix32(mix32(counter ^ key) + key)
}
