//! Whether a runtime's FP8 conversion saturates, checked once per device by casting 1e4 (beyond
//! E4M3's largest finite value, 448) with the conversion instruction path: TE's semantics need
//! the saturated code 0x7E. The repository's vendored `cubecl-cpp` writes CUDA's FP8 casts with
//! `__NV_SATFINITE`; the published 0.10.0 crate, which a crate depending on burn-lowp gets
//! (`[patch.crates-io]` applies in the root workspace only), writes `__NV_NOSAT`, which turns
//! the overflow into NaN (0x7F). Where the cast does not saturate the launchers take the integer
//! encoder (`kernel_choice::fp8_encoder`).

use std::collections::HashMap;
use std::sync::Mutex;

use cubecl::prelude::*;

use crate::cast::codec::{encode_fp8_by, Fp8Encoder, Fp8Kind};
use crate::util::buffers::arg;

/// The value cast and the code a saturating E4M3 conversion gives it.
pub const PROBE_VALUE: f32 = 1.0e4;
pub const SATURATED_E4M3: u32 = 0x7E;

#[cube(launch_unchecked)]
fn saturation_probe_kernel(input: &Array<f32>, output: &mut Array<u32>) {
    if ABSOLUTE_POS == 0 {
        output[0] = encode_fp8_by(input[0], Fp8Kind::E4M3, Fp8Encoder::Instruction);
    }
}

/// The E4M3 code the conversion instruction path gives `PROBE_VALUE` on `client`'s device (one
/// launch and one blocking read; `None` if the read fails).
pub fn probe_instruction_code<R: Runtime>(client: &ComputeClient<R>) -> Option<u32> {
    let input = client.create_from_slice(&PROBE_VALUE.to_le_bytes());
    let output = client.create_from_slice(&[0xFFu8; 4]);
    unsafe {
        saturation_probe_kernel::launch_unchecked::<R>(
            client,
            CubeCount::Static(1, 1, 1),
            CubeDim::new_1d(1),
            arg(&input, 1),
            arg(&output, 1),
        )
    };
    let bytes = client.read_one(output).ok()?;
    Some(u32::from_le_bytes(bytes.get(..4)?.try_into().ok()?))
}

/// Probe results by device (the address of the client's device properties, one per device).
static SATURATES: Mutex<Option<HashMap<usize, bool>>> = Mutex::new(None);

/// Whether `client`'s FP8 conversion instruction path saturates (probed on the first call for
/// each device). Call only where the runtime has the conversion (`fp8_encoder` checks first):
/// elsewhere the probe's kernel would not compile.
pub fn instruction_saturates<R: Runtime>(client: &ComputeClient<R>) -> bool {
    let key = client.properties() as *const _ as usize;
    if let Some(known) = SATURATES.lock().unwrap_or_else(|p| p.into_inner()).as_ref().and_then(|m| m.get(&key)) {
        return *known;
    }
    // Probed outside the lock (a blocking read); two threads may both probe, with one result.
    let saturates = probe_instruction_code(client) == Some(SATURATED_E4M3);
    SATURATES
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .get_or_insert_with(HashMap::new)
        .insert(key, saturates);
    saturates
}
