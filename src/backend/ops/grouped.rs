//! `GroupedOps`: the ops of grouped (MoE) matrices: the aligned layout of a token batch split by
//! device-resident split sizes, grouped quantization (each group as its slice alone would be),
//! the grouped GEMM and its epilogue, and moving token rows between the packed and aligned
//! layouts. The Burn-op reference of each default is below the trait: the path on NdArray and
//! wgpu, and the twin the fused CubeCL kernels and the CUDA grouped GEMMs are tested against.
//! The types are in `backend::grouped`.

use burn::tensor::ops::{FloatTensor, IntTensor};
use burn::tensor::{
    Int, Shape, Tensor, TensorCreationOptions, TensorMetadata, TensorPrimitive,
};

use super::rows::column_sum;
use crate::backend::grouped::{
    check_grouped_options, check_packed_rows, group_view, grouped_output_shape,
};
use crate::backend::{
    float_dtype, GemmKind, GemmOptions, GemmPath, GroupEpilogue, GroupLayout, GroupedFp8Scaling,
    GroupedGemmPath, GroupedOperand, Groups, InputRows, LowpBackend, QuantizedTensor, RowMove,
    ScaleColumns, AmaxHistoryColumns, Storage,
};
use crate::error::{LowpError, Result};
use crate::format::grouped::GroupScaling;
use crate::format::{Direction, FormatConfig, Fp8Format, Usage};

pub trait GroupedOps<B: LowpBackend> {
    /// The aligned layout (`GroupLayout`) of `tokens` packed tokens split into groups by
    /// `m_splits` (one Int per group, on the device), made without reading the splits on the
    /// host; their host copy is requested at once. Errors only on what the host knows (the
    /// shape); the splits' own check is read with their host copy (`GroupLayout::check`).
    fn grouped_layout(m_splits: IntTensor<B>, tokens: usize) -> Result<GroupLayout<B>>;

    /// Quantizes a grouped `[rows, cols]` matrix (`format::grouped`): each group as its slice
    /// alone would be, laid out group after group. Compact scales. FP8 current scaling under
    /// `GroupScaling::Shared` gives every group the scale of the largest group amax (storages
    /// marked `shared_scale`); other formats ignore `scaling`.
    fn grouped_quantize(
        x: FloatTensor<B>,
        groups: &Groups<B>,
        config: &FormatConfig,
        usage: Usage,
        scaling: GroupScaling,
    ) -> Result<QuantizedTensor<B>>;

    /// FP8 per-tensor quantization of a grouped matrix with each group's given scale (delayed
    /// scaling): `scales` holds one f32 column per group; the result records each group's amax
    /// (and `record` receives them, as in `QuantizeOps::quantize_fp8_with_scale`). Under
    /// `GroupScaling::Shared` every group takes the smallest given scale.
    fn grouped_quantize_fp8_with_scale(
        x: FloatTensor<B>,
        fp8: Fp8Format,
        scales: ScaleColumns<B>,
        groups: &Groups<B>,
        usage: Usage,
        scaling: GroupScaling,
        record: Option<AmaxHistoryColumns<B>>,
    ) -> Result<QuantizedTensor<B>>;

    /// FP8 per-tensor grouped quantization of the packed token rows `x [layout.tokens, cols]`
    /// in `layout`'s aligned layout: exactly `grouped_quantize` (current scaling) or
    /// `grouped_quantize_fp8_with_scale` (delayed) of the padded batch
    /// `move_rows(x, layout, RowMove::Pad)`. The default pads, then quantizes
    /// (`quantize_fp8_padded_after_move`); CubeBackend's amax and cast kernels read `x` through
    /// the layout's row map, so the padded copy is never written (a GroupedLinear forward saves a
    /// write and a read of its input).
    fn grouped_quantize_fp8_padded(
        x: FloatTensor<B>,
        layout: &GroupLayout<B>,
        scaling: GroupedFp8Scaling<B>,
        usage: Usage,
        group_scaling: GroupScaling,
    ) -> Result<QuantizedTensor<B>> {
        quantize_fp8_padded_after_move(x, layout, scaling, usage, group_scaling)
    }

    /// The logical f32 `[rows, cols]` of every group of a grouped quantized tensor
    /// (`format::grouped`); rows that hold no token (label `groups.count` in `row_group`) are
    /// unspecified (statistics leave them out). The default dequantizes group by group on the
    /// host's copy of the groups (`dequantize_group_by_group`: free on NdArray; on a device
    /// backend it waits for the split sizes); CubeCL backends run FP8 per-tensor and block
    /// formats as one kernel that reads the groups on the device.
    fn grouped_dequantize(
        q: &QuantizedTensor<B>,
        direction: Direction,
        groups: &Groups<B>,
        row_group: &IntTensor<B>,
    ) -> Result<FloatTensor<B>> {
        let _ = row_group;
        dequantize_group_by_group::<B>(q, direction, groups)
    }

    /// One GEMM per group (`GemmKind` per group, see `grouped_output_shape`). The default runs
    /// each group's GEMM on the host-known groups (`grouped_gemm_per_group`); CUDA runs fprop and
    /// dgrad of BF16 and FP8 per-tensor operands as one graph-safe cuBLASLt call, or per group
    /// where the splits' host copy has arrived and that is faster (`per_group_pays`).
    fn grouped_gemm(
        kind: GemmKind,
        a: GroupedOperand<B>,
        b: GroupedOperand<B>,
        options: GemmOptions<B>,
    ) -> Result<FloatTensor<B>> {
        grouped_gemm_per_group(kind, a, b, options)
    }

    /// `grouped_gemm`, except that a grouped FP8 GEMM on per-group scales whose per-group
    /// scaling would be a pass over its output (CUDA's pointer array) may leave that pass to the
    /// caller: it then returns the unit-scale output and the two operands' per-group `scale_inv`
    /// (f32 `[groups]`, operand `a`'s then `b`'s) that group g's rows are to be multiplied by
    /// (`grouped_epilogue` applies them with the biases and the unpad in one pass). The default
    /// applies them itself.
    #[allow(clippy::type_complexity)]
    fn grouped_gemm_unscaled(
        kind: GemmKind,
        a: GroupedOperand<B>,
        b: GroupedOperand<B>,
        options: GemmOptions<B>,
    ) -> Result<(FloatTensor<B>, Option<(FloatTensor<B>, FloatTensor<B>)>)> {
        Ok((B::grouped_gemm(kind, a, b, options)?, None))
    }

    /// The path `grouped_gemm` takes for these operands.
    fn grouped_gemm_path(
        _kind: GemmKind,
        _a: GroupedOperand<B>,
        _b: GroupedOperand<B>,
    ) -> GroupedGemmPath {
        GroupedGemmPath::PerGroup(GemmPath::DequantizeMatmul)
    }

    /// The epilogue of a grouped GEMM's output `y [rows, cols]` whose row r belongs to group
    /// `row_group[r]` (`GroupEpilogue`): group g's rows multiplied by `scale_a[g] * scale_b[g]`
    /// and `bias[g]` added (rows of no group, `row_group[r] >= groups`, scaled by 0 and biased
    /// by 0), each step rounded to y's dtype; with a gather index, row r of the result is that of
    /// y row `gather[r]` (an aligned output unpadded to its tokens,
    /// `GroupLayout::packed_to_aligned`). The default runs Burn ops (`group_epilogue_by_ops`);
    /// CubeBackend one kernel.
    fn grouped_epilogue(
        y: FloatTensor<B>,
        row_group: IntTensor<B>,
        epilogue: GroupEpilogue<B>,
    ) -> FloatTensor<B> {
        group_epilogue_by_ops(y, row_group, epilogue)
    }

    /// `Σ` over each group's token rows of an aligned `[rows, cols]` tensor: `[groups, cols]`
    /// (the grouped bias gradient). The default reads the groups on the host
    /// (`grouped_column_sum_per_group`).
    fn grouped_column_sum(t: FloatTensor<B>, layout: &GroupLayout<B>) -> Result<FloatTensor<B>> {
        grouped_column_sum_per_group(t, &layout.groups)
    }

    /// The experts' bias gradient, f32 `[groups, cols]`: the column sums of each group's rows of
    /// `dy` (the aligned batch or the packed tokens, as `rows` says), and with `amax` the
    /// per-group amaxes (f32 bits, `[groups]`) where the backend takes them in the same read
    /// (CubeBackend; FP8 current scaling of dY then skips its amax pass). The default pads
    /// packed rows and sums with `grouped_column_sum` (`grouped_dbias_after_move`), and returns
    /// no amax.
    fn grouped_dbias_amax(
        dy: FloatTensor<B>,
        rows: InputRows,
        layout: &GroupLayout<B>,
        amax: bool,
    ) -> Result<(FloatTensor<B>, Option<B::Bytes>)> {
        let _ = amax;
        Ok((grouped_dbias_after_move(dy, rows, layout)?, None))
    }

    /// Rows of `t [rows, cols]` picked by `index [n]`: `[n, cols]` whose row r is `t`'s row
    /// `index[r]`, or zeros where `index[r] >= rows` (padding reads "one past the last row").
    /// Moves token rows between packed and aligned layouts (`move_rows`). The default appends a
    /// zero row and runs Burn's `select` (`select_rows_or_zero`); CubeBackend gathers rows in one
    /// kernel.
    fn grouped_gather_rows(t: FloatTensor<B>, index: IntTensor<B>) -> FloatTensor<B> {
        select_rows_or_zero::<B>(t, index)
    }
}

/// The logical f32 `[rows, cols]` of every group of a grouped quantized tensor, one group at a
/// time on the host's copy of the groups (`GroupedOps::grouped_dequantize`'s default); the
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
        let part = B::quantize_dequantize(&group_view(q, g, *group), direction)?;
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

/// `rows` rows of group view `view` as a high-precision operand: the stored tensor, or its
/// dequantized values (f32), keeping only the first `rows` rows (the group's tokens).
fn used_rows<B: LowpBackend>(
    view: &QuantizedTensor<B>,
    direction: Direction,
    rows: usize,
) -> Result<QuantizedTensor<B>> {
    let values = match view.require(direction)? {
        Storage::HighPrecision(t) => t.clone(),
        Storage::Quantized(_) => B::quantize_dequantize(view, direction)?,
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

/// The grouped GEMM as one GEMM per group (`GemmOps::gemm_quantized`) on the host-known groups,
/// each on the group's tokens only (dequantized, so each runs as `gemm_quantized` of those values
/// would), with zero rows for padding and tail. The path on NdArray and wgpu; it reads the splits
/// on the host.
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
            pieces.push(B::gemm_quantized(
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
/// Reads the groups on the host; `GroupedOps::grouped_column_sum` overrides it on CUDA.
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
                float::<B>(column_sum::<B>(
                    rows.into_primitive().tensor(),
                ))
                .reshape([1, cols])
            }
        })
        .collect();
    Ok(Tensor::cat(sums, 0).into_primitive().tensor())
}

/// `GroupedOps::grouped_quantize_fp8_padded` by its definition: the packed rows padded into the
/// aligned layout (`move_rows`), then the grouped quantize.
pub fn quantize_fp8_padded_after_move<B: LowpBackend>(
    x: FloatTensor<B>,
    layout: &GroupLayout<B>,
    scaling: GroupedFp8Scaling<B>,
    usage: Usage,
    group_scaling: GroupScaling,
) -> Result<QuantizedTensor<B>> {
    check_packed_rows(&x, layout)?;
    let aligned = move_rows::<B>(x, layout, RowMove::Pad);
    match scaling {
        // (The amax equals the one the quantize takes itself: a maximum, in any order.)
        GroupedFp8Scaling::Current(config) | GroupedFp8Scaling::CurrentFromAmax { config, .. } => B::grouped_quantize(
            aligned,
            &layout.groups,
            &FormatConfig::Fp8Current(config),
            usage,
            group_scaling,
        ),
        GroupedFp8Scaling::Delayed { fp8, scales, record } => B::grouped_quantize_fp8_with_scale(
            aligned,
            fp8,
            scales,
            &layout.groups,
            usage,
            group_scaling,
            record,
        ),
    }
}

/// `GroupedOps::grouped_dbias_amax` without a kernel of its own: the rows padded where packed,
/// then `grouped_column_sum` in f32; no amax.
pub fn grouped_dbias_after_move<B: LowpBackend>(
    dy: FloatTensor<B>,
    rows: InputRows,
    layout: &GroupLayout<B>,
) -> Result<FloatTensor<B>> {
    let aligned = match rows {
        InputRows::Aligned => dy,
        InputRows::Packed => {
            check_packed_rows(&dy, layout)?;
            move_rows::<B>(dy, layout, RowMove::Pad)
        }
    };
    let sums = B::grouped_column_sum(aligned, layout)?;
    Ok(B::float_cast(sums, burn::tensor::FloatDType::F32))
}

/// `GroupedOps::grouped_epilogue` in Burn tensor ops: the scale (in f32, rounded once to y's
/// dtype), the bias add, the gather, one after another.
pub fn group_epilogue_by_ops<B: LowpBackend>(
    y: FloatTensor<B>,
    row_group: IntTensor<B>,
    epilogue: GroupEpilogue<B>,
) -> FloatTensor<B> {
    use burn::tensor::FloatDType;
    let mut y = y;
    if let Some((scale_a, scale_b)) = epilogue.scales {
        let dtype = float_dtype(y.dtype());
        let groups = scale_a.shape().num_elements();
        let column = |t: FloatTensor<B>| {
            Tensor::<B, 2>::from_primitive(TensorPrimitive::Float(B::float_reshape(t, Shape::new([groups, 1]))))
        };
        let factor = column(scale_a).mul(column(scale_b));
        // Rows of no group read the zero row.
        let per_row = select_rows_or_zero::<B>(
            factor.into_primitive().tensor(),
            row_group.clone(),
        );
        let scaled = Tensor::<B, 2>::from_primitive(TensorPrimitive::Float(B::float_cast(y, FloatDType::F32)))
            .mul(Tensor::from_primitive(TensorPrimitive::Float(per_row)));
        y = B::float_cast(scaled.into_primitive().tensor(), dtype);
    }
    if let Some(bias) = epilogue.bias {
        y = add_selected_bias::<B>(y, bias, row_group);
    }
    match epilogue.gather {
        Some(index) => B::grouped_gather_rows(y, index),
        None => y,
    }
}

/// `t` with one zero row appended (what padding rows and the tail read).
fn with_zero_row<B: LowpBackend>(t: Tensor<B, 2>) -> Tensor<B, 2> {
    let [_, cols] = t.dims();
    let zero = Tensor::zeros(
        [1, cols],
        TensorCreationOptions::new(t.device()).with_dtype(t.dtype()),
    );
    Tensor::cat(vec![t, zero], 0)
}

/// `GroupedOps::grouped_gather_rows` in Burn tensor ops: `t` with a zero row appended, then
/// `select` (the default for backends without a row-gather kernel).
/// Indices past the end read the zero row.
pub fn select_rows_or_zero<B: LowpBackend>(t: FloatTensor<B>, index: IntTensor<B>) -> FloatTensor<B> {
    let t = float::<B>(t);
    let rows = t.dims()[0];
    let index = Tensor::<B, 1, Int>::from_primitive(index).clamp_max(rows as i64);
    with_zero_row(t).select(0, index).into_primitive().tensor()
}

/// Moves rows of `t` (any backend, no autodiff of its own).
pub fn move_rows<B: LowpBackend>(
    t: FloatTensor<B>,
    layout: &GroupLayout<B>,
    direction: RowMove,
) -> FloatTensor<B> {
    match direction {
        // Aligned row r reads packed token aligned_to_packed[r] (`tokens`: a zero row).
        RowMove::Pad => B::grouped_gather_rows(t, layout.aligned_to_packed.clone()),
        RowMove::Unpad => B::grouped_gather_rows(t, layout.packed_to_aligned.clone()),
    }
}

/// The bias add of `GroupedOps::grouped_epilogue` in Burn tensor ops: the per-row bias matrix (a
/// zero row for groups past the bias's rows), then an add.
pub fn add_selected_bias<B: LowpBackend>(
    y: FloatTensor<B>,
    bias: FloatTensor<B>,
    row_group: IntTensor<B>,
) -> FloatTensor<B> {
    let rows_bias = float::<B>(select_rows_or_zero::<B>(bias, row_group));
    (float::<B>(y) + rows_bias).into_primitive().tensor()
}
