//! The epilogue of a grouped (MoE) GEMM's output, in raw 32-bit words, in one read and write:
//! per group g, the rows of g multiplied by `scale_a[g] * scale_b[g]` (the per-expert FP8 scales
//! a pointer-array GEMM on unit scales leaves to its consumer) and `bias[g]` added; and, gathered,
//! out row r is that for y row `index[r]` (the aligned output unpadded to its tokens).
//!
//! Rows of no group (`group[r] >= groups`: padding, tail) are scaled by 0 and add a zero bias
//! (-0 becomes +0, as the Burn-ops default gives). Each step rounds to the dtype as its unfused
//! twin does: the scaled value is rounded (as the in-place `row_scale` pass stores it), then the
//! sum with the bias is formed in f32 and rounded once (nearest even).
//!
//! Why a kernel: in Burn ops the bias add was a `select` that materialized a `[rows, cols]` bias
//! matrix and a separate add (354 µs of a 2.1 ms GroupedLinear step on an H100, ncu); here the
//! bias rows stay in cache and y is read and written once, instead of once per step (scale pass,
//! bias add, unpad).

use cubecl::prelude::*;
use cubecl::server::Handle;

use crate::grouped::row_gather::IndexKind;
use crate::util::elements::ElemKind;
use crate::util::pairs::{load_pair, round_to, store_pair};

/// Units per cube (one row per cube).
const UNITS: usize = 256;

#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub struct EpilogueConfig {
    pub kind: ElemKind,
    /// Out row r reads y row `index[r]` (else row r).
    pub gathered: bool,
    pub bias: bool,
    pub scale: bool,
}

#[cube(launch_unchecked)]
pub fn group_epilogue_kernel<I: Int>(
    y: &Array<u32>,
    bias: &Array<u32>,
    scale_a: &Array<u32>,
    scale_b: &Array<u32>,
    group: &Array<I>,
    index: &Array<I>,
    out: &mut Array<u32>,
    rows: usize,
    cols: usize,
    groups: usize,
    #[comptime] config: EpilogueConfig,
) {
    let row = CUBE_POS as usize;
    if row < rows {
        let mut src = row;
        if comptime![config.gathered] {
            src = usize::cast_from(index[row]);
        }
        let g = usize::cast_from(group[src]);
        let in_group = g < groups;
        let mut factor = 0.0f32;
        if comptime![config.scale] {
            if in_group {
                factor = f32::reinterpret(scale_a[g]) * f32::reinterpret(scale_b[g]);
            }
        }
        let base = row * cols;
        let src_base = src * cols;
        for p in range_stepped(UNIT_POS as usize, cols / 2, UNITS) {
            let (a0, b0) = load_pair(y, src_base + 2 * p, config.kind);
            let mut a = a0;
            let mut b = b0;
            if comptime![config.scale] {
                a = round_to(a * factor, config.kind);
                b = round_to(b * factor, config.kind);
            }
            if comptime![config.bias] {
                let mut ba = 0.0f32;
                let mut bb = 0.0f32;
                if in_group {
                    let (x, z) = load_pair(bias, g * cols + 2 * p, config.kind);
                    ba = x;
                    bb = z;
                }
                a += ba;
                b += bb;
            }
            store_pair(out, base + 2 * p, a, b, config.kind);
        }
    }
}

/// What the epilogue applies besides reading y: the biases `[groups, cols]` (`kind` elements),
/// the per-group f32 scale pairs, and a gather (`index`, out rows).
#[derive(Clone, Copy)]
pub struct Epilogue<'a> {
    pub bias: Option<&'a Handle>,
    pub scales: Option<(&'a Handle, &'a Handle)>,
    pub gather: Option<(&'a Handle, usize)>,
}

/// The epilogue of `y [rows, cols]` (`kind` elements, `cols` even) whose rows belong to the
/// groups `group[r]` (an integer array of `index_kind`, as is the gather index); a new buffer of
/// `rows` rows, or the gather's.
#[allow(clippy::too_many_arguments)]
pub fn group_epilogue<R: Runtime>(
    client: &ComputeClient<R>,
    y: &Handle,
    group: &Handle,
    index_kind: IndexKind,
    rows: usize,
    cols: usize,
    groups: usize,
    kind: ElemKind,
    epilogue: Epilogue,
) -> Handle {
    assert!(cols % 2 == 0, "callers check for whole words");
    if kind == ElemKind::F32 && epilogue.scales.is_some() && epilogue.bias.is_some() {
        // In f32 nothing rounds between the scaling and the bias add, and the CUDA compiler
        // contracts the two into one FMA (one rounding, where the unfused twin rounds twice:
        // 1-ulp differences, seen on an H100). Two launches keep them apart; the training path
        // (BF16 outputs) rounds explicitly in between and stays one pass.
        let run = |y: &Handle, epilogue| {
            group_epilogue(client, y, group, index_kind, rows, cols, groups, kind, epilogue)
        };
        let scaled = run(
            y,
            Epilogue {
                bias: None,
                gather: None,
                ..epilogue
            },
        );
        return run(
            &scaled,
            Epilogue {
                scales: None,
                ..epilogue
            },
        );
    }
    let words = rows * cols * kind.bytes() / 4;
    let out_rows = epilogue.gather.map_or(rows, |(_, n)| n);
    let out_words = out_rows * cols * kind.bytes() / 4;
    let out = client.empty(out_words.max(1) * 4);
    if out_words == 0 {
        return out;
    }
    let count = cubecl::server::CubeCountSelection::new(client, out_rows as u32).cube_count();
    let arg = |h: &Handle, len: usize| unsafe { ArrayArg::from_raw_parts(h.clone(), len.max(1)) };
    let bias_words = groups * cols * kind.bytes() / 4;
    let index = epilogue.gather.map_or(group, |(index, _)| index);
    let bias = epilogue.bias.unwrap_or(y);
    let (scale_a, scale_b) = epilogue.scales.unwrap_or((y, y));
    let config = EpilogueConfig {
        kind,
        gathered: epilogue.gather.is_some(),
        bias: epilogue.bias.is_some(),
        scale: epilogue.scales.is_some(),
    };
    macro_rules! launch {
        ($i:ty) => {
            unsafe {
                group_epilogue_kernel::launch_unchecked::<$i, R>(
                    client,
                    count,
                    CubeDim::new_1d(UNITS as u32),
                    arg(y, words),
                    arg(bias, if config.bias { bias_words } else { 1 }),
                    arg(scale_a, if config.scale { groups } else { 1 }),
                    arg(scale_b, if config.scale { groups } else { 1 }),
                    arg(group, rows),
                    arg(index, out_rows),
                    arg(&out, out_words),
                    out_rows,
                    cols,
                    groups,
                    config,
                )
            }
        };
    }
    match index_kind {
        IndexKind::I32 => launch!(i32),
        IndexKind::I64 => launch!(i64),
    }
    out
}
