//! Grouped (MoE) GEMMs on CUDA through cuBLASLt, chosen by the operands' formats
//! (MEASUREMENTS.md has the measurements):
//!
//! * **Pointer array** (graph-safe; fprop and dgrad of BF16/F16/F32 and FP8 per-tensor operands):
//!   one cuBLASLt call whose batch entries are the 128-row chunks of the aligned activation, each
//!   multiplied by its group's weight; our kernel writes the pointer arrays from the groups'
//!   device offsets on our stream, so the host never reads the splits. cuBLASLt applies one scale
//!   per operand to a whole batch, so FP8 runs on unit scales, writing the output dtype (BF16) or
//!   f32 (any other), and one in-place pass (`row_scale`) multiplies group g's rows by
//!   `scale_inv_x[g] * scale_inv_w[g]`: each group's numbers are those of its own per-tensor FP8
//!   GEMM up to the summation order and, for BF16, one more rounding (of the unit-scale product;
//!   relative 2^-9). The BF16 write and in-place pass move 2.5x fewer bytes than an f32 output
//!   scaled into BF16, which at N = 768 cost as much as the GEMM (H100). Operands whose groups
//!   share one scale (`GroupScaling::Shared`) need no pass: cuBLASLt applies the shared scales
//!   as the operands' per-tensor scales (and fprop then runs with fast accumulation, as `Linear`).
//!   Where the splits' host copy has arrived by the time the GEMM is called and every group's
//!   GEMM alone fills the GPU, fprop/dgrad run per group instead where that measured faster
//!   (`grouped::per_group_pays`: BF16 dgrad, FP8 with per-group scales, which then need no pass).
//!   Where the copy has not arrived when the batch is queued, the batch runs the host-known bound
//!   of chunks, or, under `GroupedKernel::Sm90` (`sm90_grouped`, the default; `cublaslt` with
//!   `LOWP_GROUPED_KERNEL`) and where it supports the GEMM, our Hopper grouped GEMM, which reads
//!   the groups on the device and computes only the chunks they fill. It applies shared FP8 scales
//!   itself, and per-group ones where the caller does not take them (`defer_scales`): then no scale
//!   pass runs, which is decided when the GEMM is called (if the copy has not arrived by then, our
//!   kernel runs even if it arrives before the batch is queued). Deferred per-group scales stay the
//!   caller's: our kernel then writes the unit-scale product, as cuBLASLt does.
//! * **Per group** (wgrad, whose contraction length is the group's token count; FP8 block scaling,
//!   which cuBLASLt rejects in batches; MXFP8/NVFP4 emulation): one GEMM per non-empty group on
//!   the groups' host copy (requested when the layout was made, so usually arrived), spread over
//!   several streams with one CubeCL handshake for the whole group.

use burn::tensor::ops::FloatTensorOps;
use burn::tensor::{DType, FloatDType, Shape, TensorMetadata};
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::{BoolElement, CubeBackend, CubeRuntime, FloatElement, IntElement};
use burn_lowp_kernels as kernels;
use burn_lowp_kernels::cubecl::server::Handle;

use super::cublaslt::{
    pointer_array_bytes, run_work_on_cubecl_buffers, GroupWork, LtBatch, LtGemm, LtOperand,
    ScaleMode,
};
use super::device::{cuda_client, cuda_device, is_hopper, multiprocessors};
use super::gemm::{
    accumulate_input, data_type, fp8_type, location, output_dtype, plan, prepare, run_prepared,
    GemmOutput, PreparedGemm,
};
use crate::backend::gemm::{GemmKind, GemmOptions, GemmPath};
use crate::backend::grouped::{
    group_view, grouped_output_shape, per_group_pays, BatchedOperands, GroupedGemmPath,
    GroupedOperand, HostCopy, HostGroups, GROUP_ALIGN,
};
use super::sm90_grouped::{self, grouped_kernel, GroupedKernel, Sm90GroupedGemm, Sm90Operands};
use crate::error::Result;
use crate::format::grouped::SplitStatus;
use crate::format::{Direction, QuantFormat};
use crate::backend::quantized::{Storage, StorageScales};

type Cube<R, F, I, BT> = CubeBackend<R, F, I, BT>;

/// `(m, n, k)` of one group's GEMM in cuBLASLt's terms (`n` a 128-row chunk for fprop/dgrad).
fn group_dims<BB: crate::backend::LowpBackend>(
    kind: GemmKind,
    a: &GroupedOperand<BB>,
    b: &GroupedOperand<BB>,
) -> (usize, usize, usize) {
    let count = a.groups.count.max(1);
    match kind {
        GemmKind::Fprop => (b.tensor.rows / count, GROUP_ALIGN, a.tensor.cols),
        GemmKind::Dgrad => (b.tensor.cols, GROUP_ALIGN, a.tensor.cols),
        GemmKind::Wgrad => (b.tensor.cols, a.tensor.cols, GROUP_ALIGN),
    }
}

pub fn grouped_gemm_path<R: CubeRuntime, F: FloatElement, I: IntElement, BT: BoolElement>(
    kind: GemmKind,
    a: GroupedOperand<Cube<R, F, I, BT>>,
    b: GroupedOperand<Cube<R, F, I, BT>>,
) -> GroupedGemmPath {
    let (da, db) = kind.directions();
    let (Ok(sa), Ok(sb), Some((_, device))) =
        (a.tensor.require(da), b.tensor.require(db), location(a.tensor))
    else {
        return GroupedGemmPath::PerGroup(GemmPath::EmulatedBf16);
    };
    let inner = plan(sa, sb, group_dims(kind, &a, &b), is_hopper(cuda_device::<R>(&device)));
    let batchable = matches!(
        inner,
        GemmPath::CublasLtFp8Tensor | GemmPath::CublasLtHighPrecision
    );
    if kind != GemmKind::Wgrad && batchable {
        // Groups the host knows already (never waits) that each fill the GPU run per group
        // where that was measured faster (`per_group_pays`).
        let operands = match (sa, sb) {
            (Storage::Quantized(qa), Storage::Quantized(qb)) if qa.shared_scale && qb.shared_scale => {
                BatchedOperands::Fp8SharedScales
            }
            (Storage::Quantized(_), _) => BatchedOperands::Fp8PerGroupScales,
            _ => BatchedOperands::HighPrecision,
        };
        let out_cols = match kind {
            GemmKind::Fprop => b.tensor.rows / a.groups.count.max(1),
            _ => b.tensor.cols,
        };
        let sms = multiprocessors(cuda_device::<R>(&device));
        let per_group = a.groups.host.try_get().is_some_and(|host| {
            host.status == SplitStatus::Valid
                && per_group_pays(kind, &host.groups, out_cols, sms, operands)
        });
        if per_group {
            GroupedGemmPath::PerGroup(inner)
        } else {
            GroupedGemmPath::PointerArray(inner)
        }
    } else {
        GroupedGemmPath::PerGroup(inner)
    }
}

pub fn grouped_gemm<R: CubeRuntime, F: FloatElement, I: IntElement, BT: BoolElement>(
    kind: GemmKind,
    a: GroupedOperand<Cube<R, F, I, BT>>,
    b: GroupedOperand<Cube<R, F, I, BT>>,
    options: GemmOptions<Cube<R, F, I, BT>>,
) -> Result<CubeTensor<R>> {
    Ok(grouped_gemm_unscaled(kind, a, b, options, false)?.0)
}

/// `grouped_gemm`; with `defer_scales`, a pointer array on per-group FP8 scales writing the
/// dtype asked for leaves its scale pass to the caller and returns the two operands' per-group
/// `scale_inv` (f32 `[groups]`: ours A, then B) with the unit-scale output
/// (`GroupedOps::grouped_gemm_unscaled`).
#[allow(clippy::type_complexity)]
pub fn grouped_gemm_unscaled<R: CubeRuntime, F: FloatElement, I: IntElement, BT: BoolElement>(
    kind: GemmKind,
    a: GroupedOperand<Cube<R, F, I, BT>>,
    b: GroupedOperand<Cube<R, F, I, BT>>,
    options: GemmOptions<Cube<R, F, I, BT>>,
    defer_scales: bool,
) -> Result<(CubeTensor<R>, Option<(CubeTensor<R>, CubeTensor<R>)>)> {
    let shape = grouped_output_shape(kind, &a, &b)?;
    crate::backend::grouped::check_grouped_options(kind, &options)?;
    match grouped_gemm_path(kind, a, b) {
        GroupedGemmPath::PointerArray(inner) => {
            pointer_array(kind, a, b, inner, shape, options, defer_scales)
        }
        GroupedGemmPath::PerGroup(inner) => Ok((per_group(kind, a, b, inner, shape, options)?, None)),
    }
}

/// A byte range of a device buffer, as a view.
fn view(handle: &Handle, total: usize, start: usize, len: usize) -> Handle {
    handle
        .clone()
        .offset_start(start as u64)
        .offset_end((total - start - len) as u64)
}

fn element_bytes(dtype: DataType) -> usize {
    match dtype {
        DataType::CUDA_R_32F => 4,
        DataType::CUDA_R_16F | DataType::CUDA_R_16BF => 2,
        _ => 1,
    }
}

use cudarc::cublaslt::sys::cudaDataType_t as DataType;

/// A contiguous, 16-byte aligned high-precision `[rows, cols]` operand (the whole grouped tensor).
fn whole_tensor<R: CubeRuntime, F: FloatElement, I: IntElement, BT: BoolElement>(
    t: &CubeTensor<R>,
    rows: usize,
    cols: usize,
) -> CubeTensor<R> {
    let t = Cube::<R, F, I, BT>::float_reshape(into_contiguous(t.clone()), Shape::new([rows, cols]));
    if t.handle.offset_start.unwrap_or(0) % 16 == 0 {
        t
    } else {
        into_contiguous(Cube::<R, F, I, BT>::float_mul_scalar(t, 1.0f32.into()))
    }
}

/// The pointer-array path (module docs): A = the weights' group of each chunk, B = the chunks of
/// the activation (or gradient), D = the chunks of the output.
fn pointer_array<R: CubeRuntime, F: FloatElement, I: IntElement, BT: BoolElement>(
    kind: GemmKind,
    a: GroupedOperand<Cube<R, F, I, BT>>,
    b: GroupedOperand<Cube<R, F, I, BT>>,
    inner: GemmPath,
    [rows, cols]: [usize; 2],
    options: GemmOptions<Cube<R, F, I, BT>>,
    defer_scales: bool,
) -> Result<(CubeTensor<R>, Option<(CubeTensor<R>, CubeTensor<R>)>)> {
    let (da, db) = kind.directions();
    let (sa, sb) = (a.tensor.require(da)?, b.tensor.require(db)?);
    let (client, device) = location(a.tensor).expect("checked by the path");
    let (m, chunk, k) = group_dims(kind, &a, &b);
    let count = rows / GROUP_ALIGN;
    let mut keep: Vec<CubeTensor<R>> = Vec::new();
    // (buffer, dtype, outer-major) of A (whole grouped weight) and B (whole activation).
    let (a_data, a_type, a_outer_major, b_data, b_type, fp8_scales) = match (sa, sb) {
        (Storage::Quantized(qa), Storage::Quantized(qb)) => {
            let fp8 = |q: &crate::backend::quantized::QuantizedStorage<Cube<R, F, I, BT>>| match q.format {
                QuantFormat::Fp8Tensor { fp8 } => fp8_type(fp8),
                _ => unreachable!("pointer arrays take FP8 per-tensor operands"),
            };
            let scale = |q: &crate::backend::quantized::QuantizedStorage<Cube<R, F, I, BT>>| match &q.scales {
                StorageScales::TensorScaleInv(s) => s.handle.clone(),
                _ => unreachable!("FP8 per-tensor storage"),
            };
            // FP8 storages are [outer, k] per group: the weights' columnwise copy is each
            // expert's transpose, one after another.
            (
                qb.codes.handle.clone(),
                fp8(qb),
                true,
                qa.codes.handle.clone(),
                fp8(qa),
                Some(Fp8Scales {
                    a: scale(qa),
                    b: scale(qb),
                    shared: qa.shared_scale && qb.shared_scale,
                }),
            )
        }
        (Storage::HighPrecision(ta), Storage::HighPrecision(tb)) => {
            let tb = whole_tensor::<R, F, I, BT>(tb, b.tensor.rows, b.tensor.cols);
            let ta = whole_tensor::<R, F, I, BT>(ta, a.tensor.rows, a.tensor.cols);
            let out = (
                tb.handle.clone(),
                data_type(tb.dtype()),
                // W_g [N, K] is outer-major in fprop (outer N); in dgrad the outer dim is K.
                kind == GemmKind::Fprop,
                ta.handle.clone(),
                data_type(ta.dtype()),
                None,
            );
            keep.extend([ta, tb]);
            out
        }
        _ => unreachable!("the pointer-array path has two FP8 or two high-precision operands"),
    };
    // FP8 on per-group scales writes the unit-scale products in BF16 (asked for) or f32 (anything
    // else), scaled in place below; shared scales go to cuBLASLt as the operands' scales, and
    // BF16 operands write what was asked.
    let scale_pass = fp8_scales.as_ref().filter(|s| !s.shared);
    let d_dtype = match (scale_pass, options.out_dtype) {
        (Some(_), FloatDType::BF16) => DType::BF16,
        (Some(_), _) => DType::F32,
        (None, _) => output_dtype(inner, sa, options.out_dtype),
    };
    let out = client.empty(rows * cols * d_dtype.size());
    let pointers = client.empty(pointer_array_bytes(count));
    let groups = a.groups;
    let d_type = data_type(d_dtype);
    let group_count = groups.count as u32;
    let host_groups = groups.host.clone();
    let fast_accum =
        inner == GemmPath::CublasLtFp8Tensor && !kind.split_accumulator(options.split_accumulator);
    // Our Hopper grouped GEMM where the setting asks for it and it supports this GEMM: it runs
    // instead of a bound batch (`sm90_grouped`; in its terms A = the activation rows, B = the
    // weights, n = m output columns, k the reduction).
    let sm90 = match grouped_kernel() {
        GroupedKernel::Sm90 => sm90_grouped::variant(
            cuda_device::<R>(&device),
            Sm90Operands::of(a_type, a_outer_major, b_type, fast_accum),
            d_type,
            rows,
            m,
            k,
            groups.count,
        ),
        GroupedKernel::CublasLt => None,
    };
    // Per-group scales the caller's epilogue applies (`group_epilogue`), where the output already
    // has the dtype asked for.
    let deferring = scale_pass.is_some() && defer_scales && d_dtype == DType::from(options.out_dtype);
    // Per-group scales that our kernel applies instead of the scale pass: the pass is queued (or
    // not) here, so our kernel is chosen here, where the splits' copy has not arrived yet, and
    // then runs whatever the device thread finds.
    let kernel_scales =
        sm90.is_some() && scale_pass.is_some() && !deferring && filled_chunks(&host_groups, count).is_none();
    // The operands' scales, for cuBLASLt (shared) or our kernel (shared or `kernel_scales`): the
    // shared scales' first values are the operands' per-tensor scales; cuBLAS A is our B.
    let shared = fp8_scales.as_ref().is_some_and(|s| s.shared);
    let scale_handles = fp8_scales
        .as_ref()
        .filter(|s| s.shared || kernel_scales)
        .map(|s| [s.b.clone(), s.a.clone()]);
    let mut handles = vec![
        a_data,
        b_data,
        out.clone(),
        pointers,
        groups.start.handle.clone(),
        groups.len.handle.clone(),
    ];
    handles.extend(scale_handles.into_iter().flatten());
    let buffers: Vec<&Handle> = handles.iter().collect();
    let (a_es, b_es) = (element_bytes(a_type), element_bytes(b_type));
    run_work_on_cubecl_buffers(
        cuda_client(&client),
        cuda_device::<R>(&device),
        &buffers,
        (),
        move |ptr| {
            // The chunks the groups fill, if the splits' host copy has arrived when the task runs
            // (on CubeCL's device thread, after the operands' producers were queued); else the
            // bound, or our kernel.
            let filled = filled_chunks(&host_groups, count);
            // Our kernel's A is the activation (scales at 7), its B the weights (at 6); shared
            // scales are one value (step 0), per-group ones one per expert.
            let scale = |index: usize| match (shared, kernel_scales) {
                (true, _) => Some((ptr[index], 0)),
                (false, true) => Some((ptr[index], 1)),
                (false, false) => None,
            };
            let ours = sm90
                .filter(|_| kernel_scales || filled.is_none())
                .map(|variant| Sm90GroupedGemm {
                    variant,
                    a: ptr[1],
                    b: ptr[0],
                    d: ptr[2],
                    rows: rows as u64,
                    n: m as u32,
                    k: k as u32,
                    ldd: m as u32,
                    groups: group_count,
                    group_start: ptr[4],
                    group_rows: ptr[5],
                    scale_a: scale(7),
                    scale_b: scale(6),
                })
                // (Misaligned buffers keep cuBLASLt, which reports them, unless our kernel owes
                // the scales: then `check_aligned` reports them.)
                .filter(|g| kernel_scales || g.aligned());
            if let Some(g) = ours {
                crate::backend::host_sync::record_device_grouped_batch();
                return vec![GroupWork::Sm90(g)];
            }
            crate::backend::host_sync::record_pointer_array_batch(filled.is_some());
            vec![GroupWork::Lt(LtGemm {
                m: m as u64,
                n: chunk as u64,
                k: k as u64,
                a: LtOperand {
                    ptr: ptr[0],
                    dtype: a_type,
                    transpose: a_outer_major,
                    ld: if a_outer_major { k } else { m } as i64,
                    scale: shared.then(|| (ptr[6], ScaleMode::Tensor)),
                },
                // A chunk of the activation is [128, k] row-major: outer-major.
                b: LtOperand {
                    ptr: ptr[1],
                    dtype: b_type,
                    transpose: false,
                    ld: k as i64,
                    scale: shared.then(|| (ptr[7], ScaleMode::Tensor)),
                },
                c: None,
                d: ptr[2],
                d_dtype: d_type,
                bias: None,
                fast_accum,
                batch: Some(LtBatch {
                    count: filled.unwrap_or(count) as u64,
                    capacity: count as u64,
                    chunk_rows: GROUP_ALIGN as u32,
                    groups: group_count,
                    group_start: ptr[4],
                    group_len: ptr[5],
                    a_group_stride: (m * k * a_es) as u64,
                    b_chunk_stride: (chunk * k * b_es) as u64,
                    d_chunk_stride: (chunk * m * element_bytes(d_type)) as u64,
                    pointers: ptr[3],
                }),
                strided: None,
                autotune: true,
            })]
        },
    )?;
    drop(keep);
    // The scale pass, or the scales for the caller's epilogue (`group_epilogue`: one pass for
    // the scales, the biases and the unpad) where the output already has the dtype asked for;
    // neither where our kernel applied them.
    let deferred = scale_pass.filter(|_| deferring);
    if let Some(Fp8Scales { a: scale_a, b: scale_b, .. }) = deferred {
        let scales = |h: &Handle| {
            CubeTensor::new_contiguous(client.clone(), device.clone(), Shape::new([groups.count]), h.clone(), DType::F32)
        };
        let pair = (scales(scale_a), scales(scale_b));
        let out = CubeTensor::new_contiguous(client, device, Shape::new([rows, cols]), out, d_dtype);
        return Ok((out, Some(pair)));
    }
    if let Some(Fp8Scales { a: scale_a, b: scale_b, .. }) = scale_pass.filter(|_| !kernel_scales) {
        kernels::row_scale::group_row_scale_in_place(
            &client,
            &out,
            kernels::RowGroups {
                start: &groups.start.handle,
                rows: &groups.len.handle,
                count: groups.count,
            },
            scale_a,
            scale_b,
            rows,
            cols,
            crate::backend::cube::elem_kind(d_dtype, "grouped FP8 GEMM output")?,
        );
    }
    let out = CubeTensor::new_contiguous(client, device, Shape::new([rows, cols]), out, d_dtype);
    let out = if out.dtype() == DType::from(options.out_dtype) {
        out
    } else {
        Cube::<R, F, I, BT>::float_cast(out, options.out_dtype)
    };
    Ok((out, None))
}

/// The chunks a batch's groups fill, if the splits' host copy has arrived (never waits), is
/// valid and fits the bound of `count` chunks.
fn filled_chunks(host: &HostCopy<HostGroups>, count: usize) -> Option<usize> {
    host.try_get()
        .filter(|host| host.status == SplitStatus::Valid)
        .map(|host| host.groups.iter().map(|g| g.len).sum::<usize>() / GROUP_ALIGN)
        .filter(|&chunks| chunks <= count)
}

/// The per-group `scale_inv` arrays of a pointer-array FP8 GEMM's two operands (ours: A the
/// activation or gradient, B the weights), and whether each holds one shared value.
struct Fp8Scales {
    a: Handle,
    b: Handle,
    shared: bool,
}

/// Bytes between per-group FP8 scales handed to cuBLASLt.
const SCALE_STRIDE: usize = 16;

/// cuBLASLt rejects FP8 per-tensor scale pointers that are not 16-byte aligned (measured on an
/// H100, cuBLAS 13.1: `CUBLAS_STATUS_NOT_SUPPORTED` on every per-group FP8 wgrad while group g's
/// scale sat at byte 4g of the `[groups]` array). Spreads the per-group scales of the
/// representation the GEMM reads (`direction`) to one per 16 bytes, one launch per operand;
/// formats with block scales need nothing.
fn spread_scales<R: CubeRuntime, F: FloatElement, I: IntElement, BT: BoolElement>(
    q: &crate::backend::quantized::QuantizedTensor<Cube<R, F, I, BT>>,
    count: usize,
    direction: Direction,
) -> [Option<(Handle, usize)>; 2] {
    [
        (&q.rowwise, Direction::Rowwise),
        (&q.columnwise, Direction::Columnwise),
    ]
    .map(|(side, d)| match side {
        Some(Storage::Quantized(s)) if d == direction => match &s.scales {
            StorageScales::TensorScaleInv(b) => Some((
                kernels::spread_words(&b.client, &b.handle, count, SCALE_STRIDE / 4),
                count * SCALE_STRIDE,
            )),
            _ => None,
        },
        _ => None,
    })
}

/// Group `g`'s view with its per-tensor scales read from the spread copy (`spread_scales`).
fn aligned_scale<R: CubeRuntime, F: FloatElement, I: IntElement, BT: BoolElement>(
    mut q: crate::backend::quantized::QuantizedTensor<Cube<R, F, I, BT>>,
    spread: &[Option<(Handle, usize)>; 2],
    g: usize,
) -> crate::backend::quantized::QuantizedTensor<Cube<R, F, I, BT>> {
    for (side, spread) in [&mut q.rowwise, &mut q.columnwise].into_iter().zip(spread) {
        if let (Some(Storage::Quantized(s)), Some((spread, total))) = (side.as_mut(), spread) {
            if let StorageScales::TensorScaleInv(b) = &mut s.scales {
                b.handle = view(spread, *total, SCALE_STRIDE * g, 4);
                b.len = 4;
            }
        }
    }
    q
}

/// The per-group path (module docs): each non-empty group's GEMM writes its block of one output
/// buffer (fprop/dgrad: its aligned rows; wgrad: its `[out, in]` block), all in one handshake.
fn per_group<R: CubeRuntime, F: FloatElement, I: IntElement, BT: BoolElement>(
    kind: GemmKind,
    a: GroupedOperand<Cube<R, F, I, BT>>,
    b: GroupedOperand<Cube<R, F, I, BT>>,
    inner: GemmPath,
    [rows, cols]: [usize; 2],
    options: GemmOptions<Cube<R, F, I, BT>>,
) -> Result<CubeTensor<R>> {
    let (da, db) = kind.directions();
    let sa = a.tensor.require(da)?;
    let (client, device) = location(a.tensor).expect("an operand holds data");
    let groups_a = a.groups.host.get()?;
    groups_a.status.check("m_splits", a.groups.rows)?;
    let groups_b = b.groups.host.get()?;
    let d_dtype = output_dtype(inner, sa, options.out_dtype);
    let esize = d_dtype.size();
    let total = rows * cols * esize;
    // The output buffer: a fresh one, or (wgrad accumulating) a private copy of what it adds to,
    // into which each group's GEMM accumulates in place (C = D).
    let (out, accumulating) = match options.accumulate {
        Some(c) => {
            let c = accumulate_input::<R, F, I, BT>(c, [rows, cols], d_dtype)?;
            let c = if c.handle.can_mut() {
                c
            } else {
                into_contiguous(Cube::<R, F, I, BT>::float_mul_scalar(c, 1.0f32.into()))
            };
            (c.handle.clone(), Some(c))
        }
        None => (client.empty(total.max(4)), None),
    };
    let count = a.groups.count;
    let (spread_a, spread_b) = (
        spread_scales(a.tensor, count, da),
        spread_scales(b.tensor, count, db),
    );
    let mut prepared: Vec<PreparedGemm<R>> = Vec::new();
    let mut covered = 0;
    for g in 0..count {
        let (ga, gb) = (groups_a.groups[g], groups_b.groups[g]);
        // The block group g writes: fprop/dgrad its aligned rows, wgrad its weight block.
        let (start, len) = match kind {
            GemmKind::Wgrad => (g * (rows / count) * cols * esize, (rows / count) * cols * esize),
            _ => (ga.start * cols * esize, ga.len * cols * esize),
        };
        if kind != GemmKind::Wgrad {
            covered = ga.start + ga.len;
        }
        if ga.len == 0 {
            if kind == GemmKind::Wgrad && accumulating.is_none() {
                kernels::fill(&client, &view(&out, total, start, len), len / 4, 0);
            }
            continue;
        }
        let d = view(&out, total, start, len);
        let block_shape = [len / (cols * esize), cols];
        let c = accumulating.as_ref().map(|_| {
            CubeTensor::new_contiguous(
                client.clone(),
                device.clone(),
                Shape::new(block_shape),
                d.clone(),
                d_dtype,
            )
        });
        prepared.push(prepare(
            kind,
            &aligned_scale(group_view(a.tensor, g, ga), &spread_a, g),
            &aligned_scale(group_view(b.tensor, g, gb), &spread_b, g),
            inner,
            GemmOutput {
                d,
                d_dtype,
                c,
                bias: None,
            },
            false,
            options.split_accumulator,
        )?);
    }
    if kind != GemmKind::Wgrad && covered < rows {
        // The zero tail after the last group.
        let start = covered * cols * esize;
        kernels::fill(&client, &view(&out, total, start, total - start), (total - start) / 4, 0);
    }
    run_prepared(&client, cuda_device::<R>(&device), prepared)?;
    drop(accumulating);
    let out = CubeTensor::new_contiguous(client, device, Shape::new([rows, cols]), out, d_dtype);
    Ok(if d_dtype == DType::from(options.out_dtype) {
        out
    } else {
        Cube::<R, F, I, BT>::float_cast(out, options.out_dtype)
    })
}
