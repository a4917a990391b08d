//! Grouped (MoE) matrices on a backend: where the groups lie (`Groups`, on the device and, once
//! read, on the host), the layout of a token batch split by device-resident split sizes
//! (`GroupLayout`), views of one group of a grouped quantized tensor, and the grouped GEMM that
//! every backend can run: one GEMM per group on the host-known groups (`grouped_gemm_per_group`).
//! The layouts are specified in `format::grouped`.

use std::ops::Range;

use burn::tensor::ops::{FloatTensor, IntTensor};
use burn::tensor::{Shape, Tensor, TensorCreationOptions, TensorPrimitive};

use super::gemm::{GemmKind, GemmOptions, GemmPath};
use super::LowpBackend;
use crate::error::{LowpError, Result};
use crate::format::grouped::{group_ranges, SplitStatus};
use crate::format::{codes_shape, scales_shape, Direction};
use crate::backend::quantized::{QuantizedStorage, QuantizedTensor, Storage, StorageScales};

pub use crate::format::grouped::{aligned_rows, RowGroup, GROUP_ALIGN};

pub use super::host_copy::HostCopy;
pub use super::packed_rows::{
    check_packed_rows, group_epilogue_by_ops, grouped_dbias_after_move,
    quantize_fp8_padded_after_move, GroupEpilogue, GroupedFp8Scaling, InputRows, RowMove,
};

/// The host view of a grouped matrix's groups, and the check of the splits they came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostGroups {
    pub groups: Vec<RowGroup>,
    pub status: SplitStatus,
}

/// The row groups of a grouped `[rows, cols]` matrix (see `format::grouped`): on the device as
/// u32 arrays (start and length of each group), for kernels; on the host once read.
#[derive(Debug, Clone)]
pub struct Groups<B: LowpBackend> {
    pub count: usize,
    /// Rows of the grouped matrix (groups, then a zero tail).
    pub rows: usize,
    pub start: B::Bytes,
    pub len: B::Bytes,
    pub host: HostCopy<HostGroups>,
}

fn u32_bytes(values: impl Iterator<Item = usize>) -> Vec<u8> {
    values.flat_map(|v| (v as u32).to_le_bytes()).collect()
}

impl<B: LowpBackend> Groups<B> {
    /// Groups the host knows (e.g. the experts' weights `[count * len, cols]`).
    pub fn from_host(groups: Vec<RowGroup>, rows: usize, device: &B::Device) -> Result<Self> {
        crate::format::grouped::check_groups("grouped matrix", &groups, rows)?;
        Ok(Groups {
            count: groups.len(),
            rows,
            start: B::bytes_from_host(u32_bytes(groups.iter().map(|g| g.start)), device),
            len: B::bytes_from_host(u32_bytes(groups.iter().map(|g| g.len)), device),
            host: HostCopy::ready(HostGroups {
                groups,
                status: SplitStatus::Valid,
            }),
        })
    }
}

/// A token batch of `tokens` packed rows split into groups by `m_splits` (an Int tensor on the
/// device), laid out aligned: group g's tokens start at a multiple of 128 rows of a `[rows, _]`
/// matrix and are followed by zero padding (`format::grouped`). Made on the device without a
/// host read; the host copy of the splits is requested at once and read only where a GEMM needs
/// the groups on the host, which is also where a bad split is reported.
#[derive(Debug, Clone)]
pub struct GroupLayout<B: LowpBackend> {
    pub groups: Groups<B>,
    pub tokens: usize,
    /// Group of each aligned row (`groups.count` for padding and tail rows), `[rows]`.
    pub row_group: IntTensor<B>,
    /// Packed token of each aligned row (`tokens` for padding and tail rows), `[rows]`.
    pub aligned_to_packed: IntTensor<B>,
    /// Aligned row of each packed token, `[tokens]`.
    pub packed_to_aligned: IntTensor<B>,
}

impl<B: LowpBackend> GroupLayout<B> {
    /// Rows of the aligned matrix.
    pub fn rows(&self) -> usize {
        self.groups.rows
    }

    /// The splits' check (reads them on the host: waits if their copy has not arrived).
    pub fn check(&self) -> Result<()> {
        let host = self.groups.host.get()?;
        host.status.check("m_splits", self.tokens)
    }

    /// The groups on the host, after the splits' check.
    pub fn host_groups(&self) -> Result<Vec<RowGroup>> {
        let host = self.groups.host.get()?;
        host.status.check("m_splits", self.tokens)?;
        Ok(host.groups)
    }
}

/// A layout from splits the host has (NdArray, tests): the reference of the device kernels.
pub fn host_group_layout<B: LowpBackend>(
    m_splits: &[i32],
    tokens: usize,
    device: &B::Device,
) -> GroupLayout<B> {
    let host = crate::format::grouped::group_layout(m_splits, tokens);
    let ints = |v: &[i32]| {
        Tensor::<B, 1, burn::tensor::Int>::from_data(
            burn::tensor::TensorData::new(v.iter().map(|&x| x as i64).collect::<Vec<_>>(), [v.len()]),
            device,
        )
        .into_primitive()
    };
    GroupLayout {
        groups: Groups {
            count: host.groups.len(),
            rows: host.rows,
            start: B::bytes_from_host(u32_bytes(host.groups.iter().map(|g| g.start)), device),
            len: B::bytes_from_host(u32_bytes(host.groups.iter().map(|g| g.len)), device),
            host: HostCopy::ready(HostGroups {
                groups: host.groups.clone(),
                status: host.status,
            }),
        },
        tokens,
        row_group: ints(&host.row_group),
        aligned_to_packed: ints(&host.aligned_to_packed),
        packed_to_aligned: ints(&host.packed_to_aligned),
    }
}

/// Checks the metadata of `m_splits` the host has without reading it: one split per group.
pub fn check_splits_shape(shape: &[usize], groups: usize) -> Result<()> {
    if shape != [groups] {
        return Err(LowpError::shape(
            "m_splits",
            format!("shape {shape:?}"),
            format!("one split size per group: [{groups}]"),
        ));
    }
    Ok(())
}

fn slice_bytes<B: LowpBackend>(bytes: &B::Bytes, range: Range<usize>) -> B::Bytes {
    B::bytes_slice(bytes, range)
}

/// Group `g` (`group`) of a grouped quantized tensor, as a quantized `[group.len, cols]` tensor:
/// views of its part of every buffer (copies where the backend cannot view).
pub fn group_view<B: LowpBackend>(
    q: &QuantizedTensor<B>,
    g: usize,
    group: RowGroup,
) -> QuantizedTensor<B> {
    let side = |storage: &Option<Storage<B>>, direction: Direction| {
        storage.as_ref().map(|s| match s {
            Storage::HighPrecision(t) => {
                let t = Tensor::<B, 2>::from_primitive(TensorPrimitive::Float(t.clone()));
                Storage::HighPrecision(
                    t.slice([group.start..group.start + group.len, 0..q.cols])
                        .into_primitive()
                        .tensor(),
                )
            }
            Storage::Quantized(s) => {
                let ranges = group_ranges(&s.format, direction, q.cols, group);
                let per_group = |b: &B::Bytes| slice_bytes::<B>(b, 4 * g..4 * g + 4);
                let shape = scales_shape(&s.format, group.len, q.cols, direction);
                let scales = match &s.scales {
                    StorageScales::TensorScaleInv(b) => StorageScales::TensorScaleInv(per_group(b)),
                    StorageScales::BlockF32 { bytes, .. } => StorageScales::BlockF32 {
                        shape,
                        bytes: slice_bytes::<B>(bytes, ranges.scales),
                    },
                    StorageScales::BlockBytes { bytes, layout, .. } => StorageScales::BlockBytes {
                        shape,
                        bytes: slice_bytes::<B>(bytes, ranges.scales),
                        layout: *layout,
                    },
                };
                Storage::Quantized(QuantizedStorage {
                    format: s.format,
                    codes: slice_bytes::<B>(&s.codes, ranges.codes),
                    codes_shape: codes_shape(&s.format, group.len, q.cols, direction),
                    scales,
                    amax: s.amax.as_ref().map(per_group),
                    shared_scale: false,
                })
            }
        })
    };
    QuantizedTensor {
        rows: group.len,
        cols: q.cols,
        rowwise: side(&q.rowwise, Direction::Rowwise),
        columnwise: side(&q.columnwise, Direction::Columnwise),
    }
}

/// The logical f32 `[rows, cols]` of every group of a grouped quantized tensor, one group at a
/// time on the host's copy of the groups (`LowpBackend::lowp_grouped_dequantize`'s default); the
/// tail rows after the last group are zeros.
pub fn dequantize_group_by_group<B: LowpBackend>(
    q: &QuantizedTensor<B>,
    direction: Direction,
    groups: &Groups<B>,
) -> Result<FloatTensor<B>> {
    let host = groups.host.get()?;
    let mut parts = Vec::with_capacity(host.groups.len() + 1);
    let mut device = None;
    for (g, group) in host.groups.iter().enumerate() {
        if group.len == 0 {
            continue;
        }
        let part = B::lowp_dequantize(&group_view(q, g, *group), direction)?;
        device.get_or_insert_with(|| B::float_device(&part));
        parts.push(part);
    }
    let used: usize = host.groups.iter().map(|g| g.len).sum();
    if used < q.rows || parts.is_empty() {
        let device = match (device, q.storage(direction)) {
            (Some(d), _) => d,
            (None, Some(Storage::Quantized(s))) => B::bytes_device(&s.codes),
            (None, Some(Storage::HighPrecision(t))) => B::float_device(t),
            (None, None) => return Err(LowpError::invalid("grouped dequantize", format!("{direction:?}"), "the tensor has no such copy")),
        };
        parts.push(B::float_zeros(
            Shape::new([q.rows - used, q.cols]),
            &device,
            burn::tensor::FloatDType::F32,
        ));
    }
    Ok(if parts.len() == 1 {
        parts.pop().expect("one part")
    } else {
        B::float_cat(parts, 0)
    })
}

/// One operand of a grouped GEMM: a grouped tensor and its groups. For fprop and dgrad, operand
/// `a` is the activation or gradient (groups of tokens) and `b` the experts' weights
/// `[count * out, in]` (groups of `out` rows); for wgrad both are activations/gradients.
pub struct GroupedOperand<'a, B: LowpBackend> {
    pub tensor: &'a QuantizedTensor<B>,
    pub groups: &'a Groups<B>,
}

impl<B: LowpBackend> Clone for GroupedOperand<'_, B> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<B: LowpBackend> Copy for GroupedOperand<'_, B> {}

/// How a grouped GEMM runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GroupedGemmPath {
    /// One cuBLASLt call for every group, device splits only (graph-safe): pointer-array batches
    /// of 128-row chunks, BF16 or FP8 per-tensor (with the per-group scales folded into the rows
    /// afterwards).
    PointerArray(GemmPath),
    /// One GEMM per group on the host-known groups, each on the given path.
    PerGroup(GemmPath),
}

/// The operands of a batchable (pointer-array) grouped GEMM, as far as they decide its path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BatchedOperands {
    /// BF16/F16/F32 operands.
    HighPrecision,
    /// FP8 per-tensor operands with one scale per group: in a pointer array their products run
    /// on unit scales and a pass over the output applies each group's scales.
    Fp8PerGroupScales,
    /// FP8 per-tensor operands whose groups share one scale (cuBLASLt applies it; no pass).
    Fp8SharedScales,
}

/// Whether a fprop or dgrad whose groups the host already knows runs one GEMM per group (each
/// of its exact size, spread over streams) rather than the pointer array of 128-row chunks.
/// Only where every group's GEMM is large: the non-empty groups' output averages at least three
/// waves of 128x128 tiles over the device's `multiprocessors` (below that the per-group GEMMs
/// leave the GPU idle between waves: BF16 dgrad at 16 skewed experts, 288 tiles a group on 132
/// multiprocessors, ran at 325 TFLOP/s per group against the pointer array's 533; at 16 experts
/// x 2048 rows, 256 tiles, 0.63-0.76x). Then:
/// * dgrad, BF16 or FP8 with per-group scales: per group (H100, 8 experts x 4096 rows, K = 7168,
///   N = 2048: BF16 644 / 615 TFLOP/s balanced / skewed against the pointer array's 591-598 /
///   567-569; FP8 1056 / 1134 against 791 / 759, which also saves the scale pass);
/// * fprop, FP8 with per-group scales: per group (1326 / 1198 against 1189 / 1090);
/// * BF16 fprop (718 / 636 against 699-718 / 663-680) and FP8 with shared scales (fprop 1297 /
///   1192 against 1361 / 1263; dgrad 1052 / 1095 against 1124 / 1038) keep the pointer array.
/// Measured on an H100 in one run, `benches/results/grouped-per-group-h100/experiment/`.
pub fn per_group_pays(
    kind: GemmKind,
    groups: &[RowGroup],
    out_cols: usize,
    multiprocessors: usize,
    operands: BatchedOperands,
) -> bool {
    let wanted = match (kind, operands) {
        (GemmKind::Wgrad, _) | (_, BatchedOperands::Fp8SharedScales) => false,
        (GemmKind::Dgrad, _) => true,
        (GemmKind::Fprop, BatchedOperands::Fp8PerGroupScales) => true,
        (GemmKind::Fprop, BatchedOperands::HighPrecision) => false,
    };
    let filled: Vec<usize> = groups.iter().map(|g| g.len).filter(|&len| len > 0).collect();
    if !wanted || filled.is_empty() {
        return false;
    }
    let mean_rows = filled.iter().sum::<usize>() / filled.len();
    let tiles = mean_rows.div_ceil(128) * out_cols.div_ceil(128);
    tiles >= 3 * multiprocessors
}

/// Output shape of a grouped GEMM: fprop `[a.rows, b_out]`, dgrad `[a.rows, b.cols]`, wgrad
/// `[count * a.cols, b.cols]` (one `[a.cols, b.cols]` block per group).
pub fn grouped_output_shape<B: LowpBackend>(
    kind: GemmKind,
    a: &GroupedOperand<B>,
    b: &GroupedOperand<B>,
) -> Result<[usize; 2]> {
    let (ta, tb) = (a.tensor, b.tensor);
    if a.groups.count != b.groups.count {
        return Err(LowpError::invalid(
            "grouped GEMM operands",
            format!("{} and {} groups", a.groups.count, b.groups.count),
            "both operands have one group per expert",
        ));
    }
    let count = a.groups.count;
    let per_group_rows = |rows: usize, what: &str| {
        if rows % count != 0 {
            Err(LowpError::shape(
                what,
                format!("{rows} rows"),
                format!("the {count} experts' weights stack to a multiple of {count} rows"),
            ))
        } else {
            Ok(rows / count)
        }
    };
    let (shape, ok) = match kind {
        GemmKind::Fprop => (
            [ta.rows, per_group_rows(tb.rows, "grouped weight")?],
            ta.cols == tb.cols,
        ),
        GemmKind::Dgrad => (
            [ta.rows, tb.cols],
            ta.cols == per_group_rows(tb.rows, "grouped weight")?,
        ),
        GemmKind::Wgrad => ([count * ta.cols, tb.cols], ta.rows == tb.rows),
    };
    if !ok {
        return Err(LowpError::shape(
            format!("{kind:?} grouped GEMM operands"),
            format!("[{}, {}] and [{}, {}]", ta.rows, ta.cols, tb.rows, tb.cols),
            "the contraction dimensions differ",
        ));
    }
    Ok(shape)
}

/// `rows` rows of group view `view` as a high-precision operand: the stored tensor, or its
/// dequantized values (f32), keeping only the first `rows` rows (the group's tokens).
fn used_rows<B: LowpBackend>(
    view: &QuantizedTensor<B>,
    direction: Direction,
    rows: usize,
) -> Result<QuantizedTensor<B>> {
    let values = match view.require(direction)? {
        Storage::HighPrecision(t) => t.clone(),
        Storage::Quantized(_) => B::lowp_dequantize(view, direction)?,
    };
    let values = Tensor::<B, 2>::from_primitive(TensorPrimitive::Float(values))
        .slice([0..rows, 0..view.cols])
        .into_primitive()
        .tensor();
    let storage = Some(Storage::HighPrecision(values));
    Ok(QuantizedTensor {
        rows,
        cols: view.cols,
        rowwise: storage.clone(),
        columnwise: storage,
    })
}

fn float<B: LowpBackend>(t: FloatTensor<B>) -> Tensor<B, 2> {
    Tensor::from_primitive(TensorPrimitive::Float(t))
}

/// What every grouped GEMM path requires of its options: accumulation into the output in wgrad
/// only, and no `GemmOptions::bias` (an expert's bias is per group: the grouped linear op adds it).
pub(crate) fn check_grouped_options<B: LowpBackend>(
    kind: GemmKind,
    options: &GemmOptions<B>,
) -> Result<()> {
    if options.accumulate.is_some() && kind != GemmKind::Wgrad {
        return Err(LowpError::invalid(
            "accumulate",
            format!("{kind:?}"),
            "grouped GEMMs accumulate into their output in wgrad only",
        ));
    }
    if options.bias.is_some() {
        return Err(LowpError::invalid(
            "GEMM bias",
            "given to a grouped GEMM",
            "a grouped GEMM's biases are per group (the grouped linear op adds them)",
        ));
    }
    Ok(())
}

/// The grouped GEMM as one GEMM per group (`B::lowp_gemm`) on the host-known groups, each on the
/// group's tokens only (dequantized, so each runs as `lowp_gemm` of those values would), with
/// zero rows for padding and tail. The path on NdArray and wgpu; it reads the splits on the host.
pub fn grouped_gemm_per_group<B: LowpBackend>(
    kind: GemmKind,
    a: GroupedOperand<B>,
    b: GroupedOperand<B>,
    options: GemmOptions<B>,
) -> Result<FloatTensor<B>> {
    let shape = grouped_output_shape(kind, &a, &b)?;
    check_grouped_options(kind, &options)?;
    let groups_a = a.groups.host.get()?;
    groups_a.status.check("m_splits", a.groups.rows)?;
    let groups_b = b.groups.host.get()?;
    let (da, db) = kind.directions();
    let device = match a.tensor.rowwise.as_ref().or(a.tensor.columnwise.as_ref()) {
        Some(Storage::HighPrecision(t)) => B::float_device(t),
        Some(Storage::Quantized(s)) => B::bytes_device(&s.codes),
        None => {
            return Err(LowpError::invalid(
                "grouped GEMM operand",
                "empty",
                "holds no representation",
            ))
        }
    };
    let out_dtype = options.out_dtype;
    let zeros = |rows: usize, cols: usize| {
        B::float_zeros(Shape::new([rows, cols]), &device, out_dtype)
    };
    let accumulate = options.accumulate.map(float::<B>);
    let mut pieces = Vec::new();
    let mut covered = 0;
    for g in 0..a.groups.count {
        let (ga, gb) = (groups_a.groups[g], groups_b.groups[g]);
        let block = match kind {
            GemmKind::Wgrad => [shape[0] / a.groups.count, shape[1]],
            _ => [ga.used, shape[1]],
        };
        // Wgrad's group g writes (or accumulates into) block g of the stacked weight gradient.
        let acc = accumulate
            .as_ref()
            .map(|c| c.clone().slice([g * block[0]..(g + 1) * block[0], 0..block[1]]));
        if ga.used == 0 {
            if kind == GemmKind::Wgrad {
                pieces.push(match acc {
                    Some(c) => B::float_cast(c.into_primitive().tensor(), out_dtype),
                    None => zeros(block[0], block[1]),
                });
            }
        } else {
            let va = used_rows(&group_view(a.tensor, g, ga), da, ga.used)?;
            let vb = group_view(b.tensor, g, gb);
            let vb = match kind {
                GemmKind::Wgrad => used_rows(&vb, db, ga.used)?,
                _ => vb,
            };
            pieces.push(B::lowp_gemm(
                kind,
                &va,
                &vb,
                GemmOptions {
                    out_dtype,
                    accumulate: acc.map(|c| c.into_primitive().tensor()),
                    split_accumulator: options.split_accumulator,
                    bias: None,
                },
            )?);
        }
        if kind != GemmKind::Wgrad {
            // Padding rows after the group's tokens.
            if ga.len > ga.used {
                pieces.push(zeros(ga.len - ga.used, shape[1]));
            }
            covered = ga.start + ga.len;
        }
    }
    if kind != GemmKind::Wgrad && covered < shape[0] {
        pieces.push(zeros(shape[0] - covered, shape[1]));
    }
    Ok(B::float_cat(pieces, 0))
}

/// `Σ` over each group's token rows of `t [rows, cols]` (aligned layout): `[count, cols]`, each
/// group's sum as `column_sum` of its rows (so equal to a per-group `Linear`'s bias gradient).
/// Reads the groups on the host; `LowpBackend::grouped_column_sum` overrides it on CUDA.
pub fn grouped_column_sum_per_group<B: LowpBackend>(
    t: FloatTensor<B>,
    groups: &Groups<B>,
) -> Result<FloatTensor<B>> {
    let host = groups.host.get()?;
    let t = float::<B>(t);
    let [_, cols] = t.dims();
    let options = TensorCreationOptions::new(t.device()).with_dtype(t.dtype());
    let sums = host
        .groups
        .iter()
        .map(|group| {
            if group.used == 0 {
                Tensor::<B, 2>::zeros([1, cols], options.clone())
            } else {
                let rows = t.clone().slice([group.start..group.start + group.used, 0..cols]);
                float::<B>(crate::ops::row_broadcast::column_sum::<B>(
                    rows.into_primitive().tensor(),
                ))
                .reshape([1, cols])
            }
        })
        .collect();
    Ok(Tensor::cat(sums, 0).into_primitive().tensor())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn groups(lens: &[usize]) -> Vec<RowGroup> {
        let mut start = 0;
        lens.iter()
            .map(|&len| {
                let g = RowGroup { start, len, used: len };
                start += len;
                g
            })
            .collect()
    }

    /// The measured cases of `per_group_pays` on an H100 (132 multiprocessors).
    #[test]
    fn per_group_gemms_only_where_every_group_fills_the_gpu_and_the_operands_gain() {
        use BatchedOperands::*;
        use GemmKind::*;
        let large = groups(&[4096; 8]);
        // The bench's skewed splits (aligned): 3187, 4579, 8218, 4695, 3438, 4298, 0, 4353 tokens.
        let skewed = groups(&[3200, 4608, 8320, 4736, 3456, 4352, 0, 4480]);
        // 8 experts x 4096 rows, K = 7168, N = 2048: dgrad writes K columns, fprop N.
        for g in [&large, &skewed] {
            assert!(per_group_pays(Dgrad, g, 7168, 132, HighPrecision));
            assert!(per_group_pays(Dgrad, g, 7168, 132, Fp8PerGroupScales));
            assert!(per_group_pays(Fprop, g, 2048, 132, Fp8PerGroupScales));
            assert!(!per_group_pays(Fprop, g, 2048, 132, HighPrecision));
            assert!(!per_group_pays(Dgrad, g, 7168, 132, Fp8SharedScales));
            assert!(!per_group_pays(Fprop, g, 2048, 132, Fp8SharedScales));
            assert!(!per_group_pays(Wgrad, g, 7168, 132, HighPrecision));
        }
        // 16 experts, N = 768: balanced (fprop 16 x 6 tiles, dgrad 16 x 16) and the bench's
        // skewed splits (dgrad 18 x 16 = 288 tiles a group, measured 0.61x the pointer array);
        // 128 experts x 512 rows: the pointer array.
        let sixteen = groups(&[2048; 16]);
        let sixteen_skewed = groups(&[
            2048, 3456, 2944, 640, 896, 512, 2432, 4096, 640, 1152, 896, 4736, 768, 0, 5888, 2432,
        ]);
        for g in [&sixteen, &sixteen_skewed] {
            assert!(!per_group_pays(Fprop, g, 768, 132, Fp8PerGroupScales));
            assert!(!per_group_pays(Dgrad, g, 2048, 132, HighPrecision));
            assert!(!per_group_pays(Dgrad, g, 2048, 132, Fp8PerGroupScales));
        }
        assert!(!per_group_pays(Dgrad, &groups(&[512; 128]), 2048, 132, HighPrecision));
        // The average counts only groups with rows; no rows at all is no GEMM to split.
        assert!(per_group_pays(Dgrad, &groups(&[0, 0, 8192, 0]), 7168, 132, HighPrecision));
        assert!(!per_group_pays(Dgrad, &groups(&[0, 0, 0]), 7168, 132, HighPrecision));
        // Three waves exactly: 33 x 12 tiles = 396 on 132 multiprocessors.
        assert!(per_group_pays(Dgrad, &groups(&[33 * 128]), 1536, 132, HighPrecision));
        assert!(!per_group_pays(Dgrad, &groups(&[32 * 128]), 1536, 132, HighPrecision));
    }
}
