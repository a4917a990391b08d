//! Per-group bias add in raw 32-bit words: `out[r] = y[r] + bias[group[r]]` for the rows of a
//! grouped (MoE) matrix whose group is below `groups`; padding and tail rows (group `groups`)
//! add a zero bias (unchanged, but for -0 becoming +0, as the Burn-ops default gives). Sums are
//! formed in f32 and rounded once to the dtype (nearest even). Gathered, out row r is the sum for
//! y row `index[r]`: a grouped output unpadded to its tokens and biased in one read and write.
//!
//! Why a kernel: in Burn ops this was a `select` that materialized a `[rows, cols]` bias matrix
//! and a separate add (354 µs of a 2.1 ms GroupedLinear step on an H100, ncu); here the bias rows
//! stay in cache and y is read and written once.

use cubecl::prelude::*;
use cubecl::server::Handle;

use crate::codec::ElemKind;
use crate::pairs::{load_pair, store_pair};

/// Units per cube (one row per cube).
const UNITS: usize = 256;

/// Out row r is y row `index[r]` (gathered) or row r, plus the bias of that y row's group.
#[cube(launch_unchecked)]
pub fn group_bias_add_kernel<I: Int>(
    y: &Array<u32>,
    bias: &Array<u32>,
    group: &Array<I>,
    index: &Array<I>,
    out: &mut Array<u32>,
    rows: usize,
    cols: usize,
    groups: usize,
    #[comptime] kind: ElemKind,
    #[comptime] gathered: bool,
) {
    let row = CUBE_POS as usize;
    if row < rows {
        let mut src = row;
        if comptime![gathered] {
            src = usize::cast_from(index[row]);
        }
        let g = usize::cast_from(group[src]);
        let base = row * cols;
        let src_base = src * cols;
        for p in range_stepped(UNIT_POS as usize, cols / 2, UNITS) {
            let (a, b) = load_pair(y, src_base + 2 * p, kind);
            // Rows of no group add a zero bias (as the Burn-ops default: -0 becomes +0).
            let mut ba = 0.0f32;
            let mut bb = 0.0f32;
            if g < groups {
                let (x, z) = load_pair(bias, g * cols + 2 * p, kind);
                ba = x;
                bb = z;
            }
            store_pair(out, base + 2 * p, a + ba, b + bb, kind);
        }
    }
}

/// `y [rows, cols]` (`kind` elements, `cols` even) plus `bias [groups, cols]` row `group[r]` on
/// each row r whose group is below `groups`; a new buffer. With `gather` (`index`, `out_rows`):
/// out row r is that sum for y row `index[r]` (every index below `rows`; the same integer type
/// as `group`), so that unpadding a grouped output and adding its biases is one pass.
#[allow(clippy::too_many_arguments)]
pub fn group_bias_add<R: Runtime>(
    client: &ComputeClient<R>,
    y: &Handle,
    bias: &Handle,
    group: &Handle,
    index_kind: crate::row_gather::IndexKind,
    rows: usize,
    cols: usize,
    groups: usize,
    kind: ElemKind,
    gather: Option<(&Handle, usize)>,
) -> Handle {
    assert!(cols % 2 == 0, "callers check for whole words");
    let words = rows * cols * kind.bytes() / 4;
    let out_rows = gather.map_or(rows, |(_, n)| n);
    let out_words = out_rows * cols * kind.bytes() / 4;
    let out = client.empty(out_words.max(1) * 4);
    if out_words == 0 {
        return out;
    }
    let count = cubecl::server::CubeCountSelection::new(client, out_rows as u32).cube_count();
    let index = gather.map_or(group, |(index, _)| index);
    let arg = |h: &Handle, len: usize| unsafe { ArrayArg::from_raw_parts(h.clone(), len.max(1)) };
    let bias_words = groups * cols * kind.bytes() / 4;
    macro_rules! launch {
        ($i:ty) => {
            unsafe {
                group_bias_add_kernel::launch_unchecked::<$i, R>(
                    client,
                    count,
                    CubeDim::new_1d(UNITS as u32),
                    arg(y, words),
                    arg(bias, bias_words),
                    arg(group, rows),
                    arg(index, out_rows),
                    arg(&out, out_words),
                    out_rows,
                    cols,
                    groups,
                    kind,
                    gather.is_some(),
                )
            }
        };
    }
    match index_kind {
        crate::row_gather::IndexKind::I32 => launch!(i32),
        crate::row_gather::IndexKind::I64 => launch!(i64),
    }
    out
}
