//! TE's delayed-scaling end-of-step update (`delayed_scaling.cu`; `transformer-engine-facts.md`
//! section 3) of one module's amax history in one launch. Burn ops took about fourteen launches
//! for it (a blocked max over the history, the scale rule as elementwise ops, the roll as a
//! `cat` and a `slice_assign`), once per module direction and step, in steps that CubeCL's
//! launch path bounds. Twin: the tensor-op version in
//! `burn_lowp::quant::delayed` (`delayed_update_by_ops`), bit for bit.
//!
//! History `[len, width]` f32, row 0 the current step's amaxes (the casts record into it, see
//! `fp8::Fp8CastConfig::record_history`). Per column c:
//! 1. `amax` = the largest value of the column (`max`) or row 0 (`most_recent`), before the roll;
//! 2. a finite positive amax gives `scale = min(numerator / amax, f32::MAX)`, else the old scale
//!    stays;
//! 3. the roll: new row i = old row i + 1, new row len - 1 = old row 0, then new row 0 = 0.
//!
//! A cube covers 8 columns with 32 row lanes; each lane issues the loads of four of its rows
//! before using them (a history is read once per step, so every load is a trip to memory, and
//! one row at a time made the 1024-row update a chain of 128 such trips per lane). The lanes'
//! maxima meet in shared memory. The history's values are amaxes (non-negative, never NaN: the
//! casts record a NaN element as 0), so the maximum is order-free and exact.

use cubecl::prelude::*;
use cubecl::server::Handle;

const COLUMNS: usize = 8;
const LANES: usize = 32;
const UNITS: usize = COLUMNS * LANES;
/// Rows whose loads a lane issues together.
const UNROLL: usize = 4;

#[cube(launch_unchecked)]
pub fn delayed_update_kernel(
    history: &Array<f32>,
    scale: &Array<f32>,
    new_history: &mut Array<f32>,
    new_scale: &mut Array<f32>,
    len: usize,
    width: usize,
    numerator: f32,
    #[comptime] most_recent: bool,
) {
    let unit = UNIT_POS as usize;
    let lane = unit / COLUMNS;
    let c = CUBE_POS as usize * COLUMNS + unit % COLUMNS;
    let mut largest = 0.0f32;
    if c < width {
        let last = len - 1;
        for base in range_stepped(lane, len, LANES * UNROLL) {
            // Rows past the end re-read the last row: harmless for a maximum, never stored.
            let mut values = Array::<f32>::new(UNROLL);
            #[unroll]
            for k in 0..UNROLL {
                let r = base + k * LANES;
                let r = select(r < len, r, last);
                values[k] = history[r * width + c];
            }
            #[unroll]
            for k in 0..UNROLL {
                let r = base + k * LANES;
                if r < len {
                    let v = values[k];
                    largest = select(v > largest, v, largest);
                    if r == 0 {
                        if len > 1 {
                            new_history[last * width + c] = v;
                        }
                    } else if r >= 2 {
                        new_history[(r - 1) * width + c] = v;
                    }
                }
            }
        }
        if lane == 0 {
            new_history[c] = 0.0f32;
        }
    }
    let mut lanes = SharedMemory::<f32>::new(UNITS);
    lanes[unit] = largest;
    sync_cube();
    if lane == 0 && c < width {
        let mut amax = history[c];
        if comptime![!most_recent] {
            #[unroll]
            for l in 1..LANES {
                let v = lanes[l * COLUMNS + unit];
                amax = select(v > amax, v, amax);
            }
            amax = select(largest > amax, largest, amax);
        }
        let mut s = scale[c];
        // Finite and positive (`!(amax > 0)` also catches a NaN that a loaded record held).
        if amax > 0.0f32 && u32::reinterpret(amax) < 0x7F80_0000u32 {
            let q = numerator / amax;
            s = select(u32::reinterpret(q) >= 0x7F80_0000u32, 3.4028235e38f32, q);
        }
        new_scale[c] = s;
    }
}

/// The new history `[len, width]` and scales `[width]` (fresh buffers; the inputs are only read)
/// of one update; `numerator` is `fp8_max * 2^-margin`.
pub fn delayed_scaling_update<R: Runtime>(
    client: &ComputeClient<R>,
    history: &Handle,
    scale: &Handle,
    len: usize,
    width: usize,
    numerator: f32,
    most_recent: bool,
) -> (Handle, Handle) {
    let new_history = client.empty(4 * len * width);
    let new_scale = client.empty(4 * width);
    unsafe {
        delayed_update_kernel::launch_unchecked::<R>(
            client,
            CubeCount::Static(width.div_ceil(COLUMNS) as u32, 1, 1),
            CubeDim::new_1d(UNITS as u32),
            ArrayArg::from_raw_parts(history.clone(), len * width),
            ArrayArg::from_raw_parts(scale.clone(), width),
            ArrayArg::from_raw_parts(new_history.clone(), len * width),
            ArrayArg::from_raw_parts(new_scale.clone(), width),
            len,
            width,
            numerator,
            most_recent,
        )
    };
    (new_history, new_scale)
}
