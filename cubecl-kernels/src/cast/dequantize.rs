//! Dequantize kernels, every format and direction, to the logical row-major `[M, K]` f32 matrix
//! (columnwise copies transposed back, NVFP4's RHT inverted). Block scales must be compact.
//! Host reference: `HostQuantized::dequantize` in `burn_lowp::format`.

use crate::cast::codec::{decode_e2m1, decode_fp8, e8m0_to_f32, Fp8Kind};
use crate::cast::hadamard::inverse_rht16;
use crate::cast::mxfp8::mxfp8_scale_shapes;
use crate::cast::nvfp4::nvfp4_scale_shapes;
use crate::cast::scale::nvfp4_global_encode_scale;
use crate::grouped::group_layout::RowGroups;
use crate::util::buffers::arg;
use crate::util::grid::{ceil_div, linear_cubes};

use cubecl::prelude::*;
use cubecl::server::Handle;

/// FP8 per-tensor or block-scaled codes. `storage_rows x storage_cols` is the code layout
/// (`[M, K]` rowwise, `[K, M]` when `transposed`). `scale_rows_per_block` is 0 for one tensor
/// scale, else 1 (1x128) or 128 (128x128); blocks are 128 wide along storage columns.
#[cube(launch_unchecked)]
pub fn dequantize_fp8_kernel(
    codes: &Array<u32>,
    scales: &Array<u32>,
    out: &mut Array<f32>,
    storage_rows: usize,
    storage_cols: usize,
    #[comptime] fp8: Fp8Kind,
    #[comptime] scale_rows_per_block: usize,
    #[comptime] transposed: bool,
) {
    let word = ABSOLUTE_POS;
    if word < storage_rows * storage_cols / 4 {
        let bits = codes[word];
        #[unroll]
        for i in 0..4usize {
            let e = word * 4 + i;
            let sr = e / storage_cols;
            let sc = e % storage_cols;
            let scale_inv = if comptime![scale_rows_per_block == 0] {
                f32::reinterpret(scales[0])
            } else {
                f32::reinterpret(
                    scales[(sr / scale_rows_per_block) * (storage_cols / 128) + sc / 128],
                )
            };
            let value = decode_fp8((bits >> comptime![8 * i as u32]) & 0xFFu32, fp8) * scale_inv;
            if transposed {
                out[sc * storage_rows + sr] = value;
            } else {
                out[e] = value;
            }
        }
    }
}

/// How FP8 codes are scaled, for dequantize.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fp8Scales {
    Tensor,
    Block1x128,
    Block128x128,
}

impl Fp8Scales {
    /// Storage rows one scale covers: 0 for one tensor scale, else 1 (1x128) or 128 (128x128).
    pub(crate) fn rows_per_block(self) -> usize {
        match self {
            Fp8Scales::Tensor => 0,
            Fp8Scales::Block1x128 => 1,
            Fp8Scales::Block128x128 => 128,
        }
    }
}

/// Dequantizes FP8 codes (per-tensor or block) to f32 `[M, K]`. `transposed`: codes are `[K, M]`.
pub fn dequantize_fp8<R: Runtime>(
    client: &ComputeClient<R>,
    codes: &Handle,
    scales: &Handle,
    rows: usize,
    cols: usize,
    fp8: Fp8Kind,
    scale_kind: Fp8Scales,
    transposed: bool,
) -> Handle {
    let n = rows * cols;
    let (storage_rows, storage_cols) = if transposed {
        (cols, rows)
    } else {
        (rows, cols)
    };
    let scale_rows_per_block = scale_kind.rows_per_block();
    let scale_words = match scale_kind {
        Fp8Scales::Tensor => 1,
        _ => (storage_rows / scale_rows_per_block) * (storage_cols / 128),
    };
    let out = client.empty(n * 4);
    let units = 256usize;
    unsafe {
        dequantize_fp8_kernel::launch_unchecked::<R>(
            client,
            linear_cubes(client, ceil_div(n / 4, units)),
            CubeDim::new_1d(units as u32),
            arg(codes, n / 4),
            arg(scales, scale_words),
            arg(&out, n),
            storage_rows,
            storage_cols,
            fp8,
            scale_rows_per_block,
            transposed,
        )
    };
    out
}

/// MXFP8 codes (`[M, K]` in both directions) with compact E8M0 scales.
#[cube(launch_unchecked)]
pub fn dequantize_mxfp8_kernel(
    codes: &Array<u32>,
    scales: &Array<u8>,
    out: &mut Array<f32>,
    rows: usize,
    cols: usize,
    scale_cols: usize,
    #[comptime] fp8: Fp8Kind,
    #[comptime] rowwise: bool,
) {
    let word = ABSOLUTE_POS;
    if word < rows * cols / 4 {
        let bits = codes[word];
        #[unroll]
        for i in 0..4usize {
            let e = word * 4 + i;
            let r = e / cols;
            let c = e % cols;
            let index = if rowwise {
                r * scale_cols + c / 32
            } else {
                (r / 32) * scale_cols + c
            };
            let scale = e8m0_to_f32(u32::cast_from(scales[index]));
            out[e] = decode_fp8((bits >> comptime![8 * i as u32]) & 0xFFu32, fp8) * scale;
        }
    }
}

/// Dequantizes MXFP8 codes (compact scales) to f32 `[M, K]`.
pub fn dequantize_mxfp8<R: Runtime>(
    client: &ComputeClient<R>,
    codes: &Handle,
    scales: &Handle,
    rows: usize,
    cols: usize,
    fp8: Fp8Kind,
    rowwise: bool,
) -> Handle {
    let n = rows * cols;
    let (row_shape, col_shape) = mxfp8_scale_shapes(rows, cols);
    let shape = if rowwise { row_shape } else { col_shape };
    let out = client.empty(n * 4);
    let units = 256usize;
    unsafe {
        dequantize_mxfp8_kernel::launch_unchecked::<R>(
            client,
            linear_cubes(client, ceil_div(n / 4, units)),
            CubeDim::new_1d(units as u32),
            arg(codes, n / 4),
            arg(scales, shape[0] * shape[1]),
            arg(&out, n),
            rows,
            cols,
            shape[1],
            fp8,
            rowwise,
        )
    };
    out
}

/// NVFP4 codes: one unit per 16 codes (one block) of a storage row. Rowwise storage is `[M, K/2]`,
/// columnwise `[K, M/2]` (written back transposed, after the inverse RHT when `rht`).
#[cube(launch_unchecked)]
pub fn dequantize_nvfp4_kernel(
    codes: &Array<u32>,
    scales: &Array<u8>,
    amax: &Array<u32>,
    out: &mut Array<f32>,
    storage_rows: usize,
    storage_cols: usize,
    scale_cols: usize,
    #[comptime] transposed: bool,
    #[comptime] rht: bool,
) {
    let block = ABSOLUTE_POS;
    if block < storage_rows * storage_cols / 16 {
        let sr = (block * 16) / storage_cols;
        let sc0 = (block * 16) % storage_cols;
        let s_dec = 1.0f32 / nvfp4_global_encode_scale(f32::reinterpret(amax[0]));
        let s_b = decode_fp8(
            u32::cast_from(scales[sr * scale_cols + sc0 / 16]),
            Fp8Kind::E4M3,
        );
        // E2M1 values, the inverse RHT on them (exact), then the block scale: the reference's order.
        let mut values = Array::<f32>::new(16usize);
        #[unroll]
        for half in 0..2usize {
            let bits = codes[block * 2 + half];
            #[unroll]
            for k in 0..8usize {
                values[half * 8 + k] = decode_e2m1((bits >> comptime![4 * k as u32]) & 0xFu32);
            }
        }
        if comptime![transposed && rht] {
            inverse_rht16(&mut values);
        }
        let scale = s_b * s_dec;
        #[unroll]
        for i in 0..16usize {
            if transposed {
                out[(sc0 + i) * storage_rows + sr] = values[i] * scale;
            } else {
                out[sr * storage_cols + sc0 + i] = values[i] * scale;
            }
        }
    }
}

/// Dequantizes NVFP4 codes (compact scales) to f32 `[M, K]`.
pub fn dequantize_nvfp4<R: Runtime>(
    client: &ComputeClient<R>,
    codes: &Handle,
    scales: &Handle,
    amax: &Handle,
    rows: usize,
    cols: usize,
    rowwise: bool,
    rht: bool,
) -> Handle {
    let n = rows * cols;
    let (row_shape, col_shape) = nvfp4_scale_shapes(rows, cols);
    let (shape, storage_rows, storage_cols) = if rowwise {
        (row_shape, rows, cols)
    } else {
        (col_shape, cols, rows)
    };
    let out = client.empty(n * 4);
    let units = 256usize;
    unsafe {
        dequantize_nvfp4_kernel::launch_unchecked::<R>(
            client,
            linear_cubes(client, ceil_div(n / 16, units)),
            CubeDim::new_1d(units as u32),
            arg(codes, n / 8),
            arg(scales, shape[0] * shape[1]),
            arg(amax, 1),
            arg(&out, n),
            storage_rows,
            storage_cols,
            shape[1],
            !rowwise,
            rht && !rowwise,
        )
    };
    out
}

/// FP8 codes of a grouped matrix (`format::grouped`: group g's rows `start_g .. start_g + len_g`
/// quantized on their own) to the logical f32 `[rows, cols]`, every group in one launch, reading
/// the groups on the device: `row_group[r]` is row r's group (i32 bits; `groups` or more for
/// padding rows, written as 0). Rowwise codes are the whole matrix's `[rows, cols]`; columnwise
/// codes hold group g as its own `[cols, len_g]` at `start_g · cols`. Scales: one f32 per group
/// (`scale_rows_per_block` 0), or compact blocks 128 wide along the storage rows (1: 1x128,
/// 128: 128x128), group g's columnwise ones at the bytes its chunks precede.
#[cube(launch_unchecked)]
pub fn dequantize_fp8_grouped_kernel(
    codes: &Array<u32>,
    scales: &Array<u32>,
    row_group: &Array<u32>,
    group_start: &Array<u32>,
    group_len: &Array<u32>,
    out: &mut Array<f32>,
    rows: usize,
    cols: usize,
    groups: usize,
    #[comptime] fp8: Fp8Kind,
    #[comptime] scale_rows_per_block: usize,
    #[comptime] transposed: bool,
) {
    let e = ABSOLUTE_POS;
    if e < rows * cols {
        let r = e / cols;
        let c = e % cols;
        let g = usize::cast_from(row_group[r]);
        let mut value = 0.0f32;
        if g < groups {
            let start = usize::cast_from(group_start[g]);
            let len = usize::cast_from(group_len[g]);
            value = fp8_grouped_element(
                codes, scales, r, c, cols, g, start, len, fp8, scale_rows_per_block, transposed,
            );
        }
        out[e] = value;
    }
}

/// Dequantizes every group of a grouped FP8 matrix (`dequantize_fp8_grouped_kernel`) to f32
/// `[rows, cols]` in one launch; `row_group` holds `rows` i32 labels, `groups` start and length
/// per group. Padding rows come out as zeros.
#[allow(clippy::too_many_arguments)]
pub fn dequantize_fp8_grouped<R: Runtime>(
    client: &ComputeClient<R>,
    codes: &Handle,
    scales: &Handle,
    row_group: &Handle,
    groups: RowGroups,
    rows: usize,
    cols: usize,
    fp8: Fp8Kind,
    scale_kind: Fp8Scales,
    transposed: bool,
) -> Handle {
    let n = rows * cols;
    let scale_rows_per_block = scale_kind.rows_per_block();
    let scale_words = match scale_kind {
        Fp8Scales::Tensor => groups.count,
        // One per (rows per block x 128) elements, either direction (groups are 128-row chunks).
        _ => rows * cols / (128 * scale_rows_per_block),
    };
    let out = client.empty(n.max(1) * 4);
    let units = 256usize;
    let (start, len) = groups.args();
    unsafe {
        dequantize_fp8_grouped_kernel::launch_unchecked::<R>(
            client,
            linear_cubes(client, ceil_div(n, units)),
            CubeDim::new_1d(units as u32),
            arg(codes, n.div_ceil(4)),
            arg(scales, scale_words),
            arg(row_group, rows),
            start,
            len,
            arg(&out, n),
            rows,
            cols,
            groups.count,
            fp8,
            scale_rows_per_block,
            transposed,
        )
    };
    out
}

/// Element `(r, c)` of a grouped FP8 matrix decoded as `dequantize_fp8_grouped_kernel` decodes it:
/// row r of group g (rows `start .. start + len`), its code (rowwise `[rows, cols]`; columnwise
/// group g's own `[cols, len]` at `start · cols`) times its f32 scale (one per group, or a block
/// scale). The statistics pass that decodes copies itself (`stats`) calls it too, so the two
/// agree by construction.
#[cube]
#[allow(clippy::too_many_arguments)]
pub fn fp8_grouped_element(
    codes: &Array<u32>,
    scales: &Array<u32>,
    r: usize,
    c: usize,
    cols: usize,
    g: usize,
    start: usize,
    len: usize,
    #[comptime] fp8: Fp8Kind,
    #[comptime] scale_rows_per_block: usize,
    #[comptime] transposed: bool,
) -> f32 {
    let local = r - start;
    let mut code = r * cols + c;
    let mut scale_index = g;
    if comptime![transposed] {
        code = start * cols + c * len + local;
        if comptime![scale_rows_per_block > 0] {
            scale_index = (start / 128) * (cols / scale_rows_per_block)
                + (c / scale_rows_per_block) * (len / 128)
                + local / 128;
        }
    } else if comptime![scale_rows_per_block > 0] {
        scale_index = (r / scale_rows_per_block) * (cols / 128) + c / 128;
    }
    let bits = (codes[code / 4] >> (8 * (code % 4)) as u32) & 0xFFu32;
    decode_fp8(bits, fp8) * f32::reinterpret(scales[scale_index])
}
