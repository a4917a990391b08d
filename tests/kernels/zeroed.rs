//! `burn_lowp_kernels::util::zeroed::zeroed_words`, the arena of zeroed accumulator words: every
//! slot reads zero when handed out, even after earlier slots were written, and slots never overlap
//! (also across a new arena replacing a full one).

use burn_lowp_kernels::cubecl::prelude::*;
use burn_lowp_kernels::util::buffers::fill;
use burn_lowp_kernels::util::zeroed::zeroed_words;

use crate::common::read_words;

pub fn check_zeroed_words<R: Runtime>(device: &R::Device) {
    let client = R::client(device);
    // 600 slots of 1..=70 words: more than two arenas' worth of 256-byte slots.
    let mut slots = Vec::new();
    for i in 0..600usize {
        let n = 1 + i % 70;
        let slot = zeroed_words(&client, n);
        assert!(read_words(&client, &slot, n).iter().all(|&w| w == 0), "slot {i} ({n} words) not zero");
        fill(&client, &slot, n, i as u32 + 1);
        slots.push((slot, n));
    }
    for (i, (slot, n)) in slots.iter().enumerate() {
        let got = read_words(&client, slot, *n);
        assert!(got.iter().all(|&w| w == i as u32 + 1), "slot {i} was overwritten: {:?}", &got[..got.len().min(4)]);
    }
}

macro_rules! zeroed_suite {
    ($runtime:ty, $device:expr) => {
        #[test]
        fn zeroed_words_are_zero_and_never_shared() {
            if let Some(d) = $device {
                crate::zeroed::check_zeroed_words::<$runtime>(&d);
            }
        }
    };
}
pub(crate) use zeroed_suite;
