//! `GemmOps::gemm_quantized` on CUDA: picks the GEMM path for a pair of operands and lays them
//! out for cuBLASLt (`cublaslt/`).
//!
//! cuBLASLt is column-major; a row-major output `[rows, cols]` is the column-major `m x n` matrix
//! with `m = cols`, `n = rows`. Operand `b` of a `GemmKind` becomes cuBLAS's A (its outer
//! dimension is `m`) and operand `a` becomes B (outer dimension `n`). FP8 storages are always
//! `[outer, k]` with K contiguous (columnwise copies are physical transposes), which is the "TN"
//! layout Hopper's FP8 tensor cores require; high-precision tensors keep their logical layout and
//! are described with the transpose flags instead.
//!
//! Paths (`GemmPath`):
//! * both FP8 per-tensor (not both E5M2), dims multiples of 16: FP8 cuBLASLt with scale pointers,
//!   fast accumulation for fprop only (TE's split accumulator for dgrad/wgrad);
//! * both FP8 block (not both 128x128, not both E5M2) on Hopper: cuBLASLt `VEC128_32F` /
//!   `BLK128x128_32F`, split accumulator. Our compact block scales are rewritten into cuBLAS's
//!   layouts per call, one launch per operand (1x128: transposed to `[K/128][outer]`; 128x128:
//!   rows padded to 4);
//! * both high precision of one dtype (F32, F16, BF16): cuBLASLt in that dtype;
//! * everything else (MXFP8, NVFP4, hybrids of different kinds, mixed precision): dequantize each
//!   operand, round to BF16, BF16 cuBLASLt GEMM. Blackwell's block-scaled MXFP8/NVFP4 GEMMs are not
//!   wired up (no Blackwell GPU to test them on), so this is the path on every GPU for now.

use burn::tensor::ops::FloatTensorOps;
use burn::tensor::{DType, FloatDType, Shape, TensorMetadata};
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::{BoolElement, CubeBackend, CubeRuntime, FloatElement, IntElement};
use burn_lowp_kernels::cubecl::prelude::*;
use burn_lowp_kernels::cubecl::server::Handle;
use burn_lowp_kernels::gemm_block_scales::{gemm_block_scales, GemmBlockScales};
use cudarc::cublaslt::sys::cudaDataType_t as DataType;

use super::cublaslt::{run_group_on_cubecl_buffers, LtGemm, LtOperand, ScaleMode};
use super::device::{cuda_client, cuda_device, is_hopper};
use crate::backend::gemm::{check_bias, GemmCall, GemmKind, GemmOptions, GemmPath};
use crate::backend::gemm_profile::{self as profile, GemmPhase};
use crate::backend::{LowpBackend, QuantizeOps};
use crate::error::{LowpError, Result};
use crate::format::fp8_block::BlockShape;
use crate::format::{Direction, Fp8Format, QuantFormat, ScaleLayout};
use crate::backend::quantized::{QuantizedStorage, QuantizedTensor, Storage, StorageScales};

type Cube<R, F, I, BT> = CubeBackend<R, F, I, BT>;

/// The client and device of an operand (every operand of one GEMM lives on one device).
pub(crate) fn location<R: CubeRuntime, F: FloatElement, I: IntElement, BT: BoolElement>(
    q: &QuantizedTensor<Cube<R, F, I, BT>>,
) -> Option<(ComputeClient<R>, R::Device)> {
    [&q.rowwise, &q.columnwise]
        .into_iter()
        .flatten()
        .next()
        .map(|s| match s {
            Storage::Quantized(s) => (s.codes.client.clone(), s.codes.device.clone()),
            Storage::HighPrecision(t) => (t.client.clone(), t.device.clone()),
        })
}

/// Which cuBLASLt path runs `kind` on these storages.
pub(crate) fn plan<BB: LowpBackend>(
    a: &Storage<BB>,
    b: &Storage<BB>,
    shape: (usize, usize, usize),
    hopper: bool,
) -> GemmPath {
    let (m, n, k) = shape;
    let aligned = m % 16 == 0 && n % 16 == 0 && k % 16 == 0;
    match (a, b) {
        (Storage::Quantized(qa), Storage::Quantized(qb)) => match (qa.format, qb.format) {
            (QuantFormat::Fp8Tensor { fp8: fa }, QuantFormat::Fp8Tensor { fp8: fb })
                if aligned && !(fa == Fp8Format::E5M2 && fb == Fp8Format::E5M2) =>
            {
                GemmPath::CublasLtFp8Tensor
            }
            (
                QuantFormat::Fp8Block { fp8: fa, block: ba },
                QuantFormat::Fp8Block { fp8: fb, block: bb },
            ) if hopper
                && aligned
                && !(fa == Fp8Format::E5M2 && fb == Fp8Format::E5M2)
                && !(ba == BlockShape::OneTwentyEightSquare
                    && bb == BlockShape::OneTwentyEightSquare) =>
            {
                GemmPath::CublasLtFp8Block
            }
            _ => GemmPath::EmulatedBf16,
        },
        (Storage::HighPrecision(ta), Storage::HighPrecision(tb))
            if ta.dtype() == tb.dtype()
                && matches!(ta.dtype(), DType::F32 | DType::F16 | DType::BF16) =>
        {
            GemmPath::CublasLtHighPrecision
        }
        _ => GemmPath::EmulatedBf16,
    }
}

/// `(rows_out, cols_out, contraction)` of `kind`, checked.
pub(crate) fn dims<BB: LowpBackend>(
    kind: GemmKind,
    a: &QuantizedTensor<BB>,
    b: &QuantizedTensor<BB>,
) -> Result<(usize, usize, usize)> {
    let out = kind.output_shape([a.rows, a.cols], [b.rows, b.cols])?;
    let k = match kind {
        GemmKind::Fprop => a.cols,
        GemmKind::Dgrad => a.cols,
        GemmKind::Wgrad => a.rows,
    };
    Ok((out[0], out[1], k))
}

/// The path `gemm_quantized` takes on CUDA.
pub fn gemm_path<R: CubeRuntime, F: FloatElement, I: IntElement, BT: BoolElement>(
    kind: GemmKind,
    a: &QuantizedTensor<Cube<R, F, I, BT>>,
    b: &QuantizedTensor<Cube<R, F, I, BT>>,
) -> GemmPath {
    let (da, db) = kind.directions();
    let (Ok(sa), Ok(sb), Ok((rows, cols, k)), Some((_, device))) =
        (a.require(da), b.require(db), dims(kind, a, b), location(a))
    else {
        return GemmPath::EmulatedBf16;
    };
    plan(
        sa,
        sb,
        (cols, rows, k),
        is_hopper(cuda_device::<R>(&device)),
    )
}

pub(crate) fn data_type(dtype: DType) -> DataType {
    match dtype {
        DType::F32 => DataType::CUDA_R_32F,
        DType::F16 => DataType::CUDA_R_16F,
        DType::BF16 => DataType::CUDA_R_16BF,
        other => unreachable!("float GEMM dtype {other:?}"),
    }
}

pub(crate) fn fp8_type(fp8: Fp8Format) -> DataType {
    match fp8 {
        Fp8Format::E4M3 => DataType::CUDA_R_8F_E4M3,
        Fp8Format::E5M2 => DataType::CUDA_R_8F_E5M2,
    }
}

/// A contiguous `[rows, cols]` tensor whose data starts 16-byte aligned.
pub(crate) fn contiguous<R: CubeRuntime, F: FloatElement, I: IntElement, BT: BoolElement>(
    t: CubeTensor<R>,
    rows: usize,
    cols: usize,
) -> CubeTensor<R> {
    let t = Cube::<R, F, I, BT>::float_reshape(into_contiguous(t), Shape::new([rows, cols]));
    if t.handle.offset_start.unwrap_or(0) % 16 == 0 {
        t
    } else {
        into_contiguous(Cube::<R, F, I, BT>::float_mul_scalar(t, 1.0f32.into()))
    }
}

fn f32_view<R: CubeRuntime>(bytes: &crate::backend::cube::CubeBytes<R>, shape: [usize; 2]) -> CubeTensor<R> {
    CubeTensor::new_contiguous(
        bytes.client.clone(),
        bytes.device.clone(),
        Shape::new(shape),
        bytes.handle.clone(),
        DType::F32,
    )
}

/// FP8 block scales in the layout cuBLASLt reads (see the module docs): one launch per operand
/// (`gemm_block_scales`), none for 128x128 scales whose rows are already a multiple of 4.
fn block_scales<R: CubeRuntime, F: FloatElement, I: IntElement, BT: BoolElement>(
    storage: &QuantizedStorage<Cube<R, F, I, BT>>,
    block: BlockShape,
) -> Result<(CubeTensor<R>, ScaleMode)> {
    let StorageScales::BlockF32 { shape, bytes } = &storage.scales else {
        return Err(LowpError::invalid(
            "FP8 block scales",
            "not f32 block scales",
            "an FP8 block storage carries f32 scales",
        ));
    };
    let [rows, cols] = *shape;
    let rewritten = |layout, shape: [usize; 2]| {
        let handle = gemm_block_scales(&bytes.client, &bytes.handle, rows, cols, layout);
        CubeTensor::new_contiguous(
            bytes.client.clone(),
            bytes.device.clone(),
            Shape::new(shape),
            handle,
            DType::F32,
        )
    };
    Ok(match block {
        BlockShape::OneByOneTwentyEight => (
            rewritten(GemmBlockScales::Transposed, [cols, rows]),
            ScaleMode::Vec128,
        ),
        BlockShape::OneTwentyEightSquare if cols % 4 == 0 => {
            (f32_view(bytes, *shape), ScaleMode::Block128x128)
        }
        BlockShape::OneTwentyEightSquare => (
            rewritten(GemmBlockScales::PaddedRows, [rows, cols.div_ceil(4) * 4]),
            ScaleMode::Block128x128,
        ),
    })
}

/// One operand as cuBLASLt reads it: buffer, element type, whether it is stored outer-major
/// (`[outer, k]`, K contiguous), and its scale.
struct LtInput {
    data: Handle,
    dtype: DataType,
    outer_major: bool,
    scale: Option<(Handle, ScaleMode)>,
}

/// Lays out operand `q` (its `direction` storage `s`) for `path`: FP8 codes as stored (always
/// `[outer, k]`), high precision in its logical layout (`hp_outer_major` says whether that is
/// `[outer, k]`), anything else dequantized to BF16. Tensors made here go to `keep`.
#[allow(clippy::too_many_arguments)]
fn lt_input<R: CubeRuntime, F: FloatElement, I: IntElement, BT: BoolElement>(
    path: GemmPath,
    q: &QuantizedTensor<Cube<R, F, I, BT>>,
    s: &Storage<Cube<R, F, I, BT>>,
    direction: Direction,
    outer: usize,
    k: usize,
    hp_outer_major: bool,
    keep: &mut Vec<CubeTensor<R>>,
) -> Result<LtInput> {
    type B<R, F, I, BT> = Cube<R, F, I, BT>;
    match path {
        GemmPath::CublasLtFp8Tensor | GemmPath::CublasLtFp8Block => {
            let Storage::Quantized(st) = s else {
                unreachable!("FP8 paths have quantized operands")
            };
            if st.codes_shape != [outer, k] {
                return Err(LowpError::shape(
                    "FP8 GEMM operand codes",
                    format!("{:?}", st.codes_shape),
                    format!("[{outer}, {k}] (outer dimension, contraction)"),
                ));
            }
            let (fp8, scale) = match (&st.format, &st.scales) {
                (QuantFormat::Fp8Tensor { fp8 }, StorageScales::TensorScaleInv(bytes)) => {
                    (*fp8, (bytes.handle.clone(), ScaleMode::Tensor))
                }
                (QuantFormat::Fp8Block { fp8, block }, _) => {
                    let (scales, mode) = block_scales::<R, F, I, BT>(st, *block)?;
                    let handle = scales.handle.clone();
                    keep.push(scales);
                    (*fp8, (handle, mode))
                }
                _ => unreachable!("planned as FP8"),
            };
            Ok(LtInput {
                data: st.codes.handle.clone(),
                dtype: fp8_type(fp8),
                outer_major: true,
                scale: Some(scale),
            })
        }
        GemmPath::CublasLtHighPrecision => {
            let Storage::HighPrecision(t) = s else {
                unreachable!("high-precision path")
            };
            let t = contiguous::<R, F, I, BT>(t.clone(), q.rows, q.cols);
            let (data, dtype) = (t.handle.clone(), data_type(t.dtype()));
            keep.push(t);
            Ok(LtInput {
                data,
                dtype,
                outer_major: hp_outer_major,
                scale: None,
            })
        }
        _ => {
            // Emulation: the operand's values in BF16, logical layout.
            let t = match s {
                Storage::HighPrecision(t) => contiguous::<R, F, I, BT>(t.clone(), q.rows, q.cols),
                Storage::Quantized(st) => {
                    let swizzled = matches!(
                        st.scales,
                        StorageScales::BlockBytes {
                            layout: ScaleLayout::Swizzled,
                            ..
                        }
                    );
                    if swizzled {
                        let compact = B::<R, F, I, BT>::quantize_unswizzle_scales(q.clone())?;
                        B::<R, F, I, BT>::quantize_dequantize(&compact, direction)?
                    } else {
                        B::<R, F, I, BT>::quantize_dequantize(q, direction)?
                    }
                }
            };
            let t = into_contiguous(B::<R, F, I, BT>::float_cast(t, FloatDType::BF16));
            let data = t.handle.clone();
            keep.push(t);
            Ok(LtInput {
                data,
                dtype: DataType::CUDA_R_16BF,
                outer_major: hp_outer_major,
                scale: None,
            })
        }
    }
}

/// The dtype cuBLASLt writes for `wanted` on `path`: FP32 inputs give FP32 (cast afterwards).
pub(crate) fn output_dtype<BB: LowpBackend>(
    path: GemmPath,
    a: &Storage<BB>,
    wanted: FloatDType,
) -> DType {
    match (path, a) {
        (GemmPath::CublasLtHighPrecision, Storage::HighPrecision(t)) if t.dtype() == DType::F32 => {
            DType::F32
        }
        _ => DType::from(wanted),
    }
}

/// A GEMM made ready for cuBLASLt: every buffer it touches, in the order `build` reads their
/// device pointers, and the tensors that must live until it has run.
pub(crate) struct PreparedGemm<R: CubeRuntime> {
    pub handles: Vec<Handle>,
    pub keep: Vec<CubeTensor<R>>,
    pub build: Box<dyn FnOnce(&[u64]) -> LtGemm + Send>,
}

/// Where a prepared GEMM writes: `d` (`[rows, cols]` of `d_dtype`, possibly a view into a larger
/// buffer), optionally adding `c` (same shape and dtype) and, in cuBLASLt's epilogue, `bias`
/// (`[cols]`, contiguous, of `d_dtype`) to every row.
pub(crate) struct GemmOutput<R: CubeRuntime> {
    pub d: Handle,
    pub d_dtype: DType,
    pub c: Option<CubeTensor<R>>,
    pub bias: Option<CubeTensor<R>>,
}

/// Prepares `kind` on `a` and `b` along `path` (a cuBLASLt path of `plan`), writing `out`.
pub(crate) fn prepare<R: CubeRuntime, F: FloatElement, I: IntElement, BT: BoolElement>(
    kind: GemmKind,
    a: &QuantizedTensor<Cube<R, F, I, BT>>,
    b: &QuantizedTensor<Cube<R, F, I, BT>>,
    path: GemmPath,
    out: GemmOutput<R>,
    autotune: bool,
    split_accumulator: Option<bool>,
) -> Result<PreparedGemm<R>> {
    let (rows, cols, k) = dims(kind, a, b)?;
    let (m, n) = (cols, rows);
    let (da, db) = kind.directions();
    let (sa, sb) = (a.require(da)?, b.require(db)?);
    let mut keep = Vec::new();
    // cuBLAS A = operand b (outer m), B = operand a (outer n). High-precision layouts: b is
    // [outer, k] only in fprop (W [N, K]); a is [k, outer] only in wgrad (dY [M, N]).
    let la = lt_input(path, b, sb, db, m, k, kind == GemmKind::Fprop, &mut keep)?;
    let lb = lt_input(path, a, sa, da, n, k, kind != GemmKind::Wgrad, &mut keep)?;
    let mut handles = vec![la.data.clone(), lb.data.clone(), out.d.clone()];
    handles.extend([&la.scale, &lb.scale].into_iter().flatten().map(|(h, _)| h.clone()));
    if let Some(c) = &out.c {
        handles.push(c.handle.clone());
    }
    if let Some(bias) = &out.bias {
        handles.push(bias.handle.clone());
    }
    let (a_mode, b_mode) = (la.scale.as_ref().map(|s| s.1), lb.scale.as_ref().map(|s| s.1));
    let fast_accum = path == GemmPath::CublasLtFp8Tensor && !kind.split_accumulator(split_accumulator);
    let has_c = out.c.is_some();
    let has_bias = out.bias.is_some();
    let (a_type, b_type, a_outer_major, b_outer_major) =
        (la.dtype, lb.dtype, la.outer_major, lb.outer_major);
    let d_type = data_type(out.d_dtype);
    let build = Box::new(move |ptr: &[u64]| {
        // ptr order: a, b, d, [scales of A then B], [c], [bias]
        let mut next = 3;
        let mut scale = |mode: Option<ScaleMode>| {
            mode.map(|mode| {
                let p = ptr[next];
                next += 1;
                (p, mode)
            })
        };
        let a_scale = scale(a_mode);
        let b_scale = scale(b_mode);
        LtGemm {
            m: m as u64,
            n: n as u64,
            k: k as u64,
            // A: [m, k] row-major is op = T with ld k; [k, m] is op = N with ld m.
            a: LtOperand {
                ptr: ptr[0],
                dtype: a_type,
                transpose: a_outer_major,
                ld: if a_outer_major { k } else { m } as i64,
                scale: a_scale,
            },
            // B: [n, k] row-major is op = N with ld k; [k, n] is op = T with ld n.
            b: LtOperand {
                ptr: ptr[1],
                dtype: b_type,
                transpose: !b_outer_major,
                ld: if b_outer_major { k } else { n } as i64,
                scale: b_scale,
            },
            c: has_c.then(|| ptr[next]),
            d: ptr[2],
            d_dtype: d_type,
            bias: has_bias.then(|| ptr[next + usize::from(has_c)]),
            fast_accum,
            batch: None,
            strided: None,
            autotune,
        }
    });
    keep.extend(out.c);
    keep.extend(out.bias);
    Ok(PreparedGemm {
        handles,
        keep,
        build,
    })
}

/// Checks an accumulate-into tensor's shape and gives it the output's dtype and layout.
pub(crate) fn accumulate_input<R: CubeRuntime, F: FloatElement, I: IntElement, BT: BoolElement>(
    c: CubeTensor<R>,
    [rows, cols]: [usize; 2],
    d_dtype: DType,
) -> Result<CubeTensor<R>> {
    let shape = c.shape();
    if shape.as_slice() != [rows, cols] {
        return Err(LowpError::shape(
            "accumulate",
            format!("{:?}", shape.as_slice()),
            format!("the GEMM output is [{rows}, {cols}]"),
        ));
    }
    let c = if c.dtype() == d_dtype {
        c
    } else {
        Cube::<R, F, I, BT>::float_cast(c, d_dtype.into())
    };
    Ok(contiguous::<R, F, I, BT>(c, rows, cols))
}

/// Runs `kind` through cuBLASLt (`R` must be `CudaRuntime`).
pub fn gemm<R: CubeRuntime, F: FloatElement, I: IntElement, BT: BoolElement>(
    kind: GemmKind,
    a: &QuantizedTensor<Cube<R, F, I, BT>>,
    b: &QuantizedTensor<Cube<R, F, I, BT>>,
    options: GemmOptions<Cube<R, F, I, BT>>,
) -> Result<CubeTensor<R>> {
    let mut out = gemm_group(vec![GemmCall {
        kind,
        a,
        b,
        options,
    }])?;
    Ok(out.pop().expect("one GEMM, one output"))
}

/// Runs GEMMs that belong together (a layer's dgrad and wgrad) through cuBLASLt with one ordering
/// handshake for all of them (`R` must be `CudaRuntime`); GEMMs on another device than the first
/// run on their own.
pub fn gemm_group<R: CubeRuntime, F: FloatElement, I: IntElement, BT: BoolElement>(
    calls: Vec<GemmCall<'_, Cube<R, F, I, BT>>>,
) -> Result<Vec<CubeTensor<R>>> {
    let called = profile::start();
    let mut outputs = Vec::with_capacity(calls.len());
    let mut prepared = Vec::with_capacity(calls.len());
    let mut group_device: Option<(ComputeClient<R>, usize)> = None;
    for GemmCall {
        kind,
        a,
        b,
        options,
    } in calls
    {
        let (rows, cols, k) = dims(kind, a, b)?;
        let (da, db) = kind.directions();
        let (sa, sb) = (a.require(da)?, b.require(db)?);
        let (client, device) = location(a).ok_or_else(|| {
            LowpError::invalid("GEMM operand", "no representation", "an operand holds data")
        })?;
        let device_index = cuda_device::<R>(&device);
        if group_device
            .as_ref()
            .is_some_and(|(_, d)| *d != device_index)
        {
            outputs.push((gemm(kind, a, b, options)?, FloatDType::F32, false, None));
            continue;
        }
        let path = plan(sa, sb, (cols, rows, k), is_hopper(device_index));
        let d_dtype = output_dtype(path, sa, options.out_dtype);
        let c = options
            .accumulate
            .map(|c| accumulate_input::<R, F, I, BT>(c, [rows, cols], d_dtype))
            .transpose()?;
        // A BF16 output of a BF16 or FP8 per-tensor GEMM takes the bias in cuBLASLt's epilogue
        // (a BF16 bias vector, as cuBLASLt asks for with a BF16 output); F32 outputs and
        // block-scaled GEMMs (whose epilogue support cuBLASLt does not document) get it added
        // afterwards.
        let fusable = d_dtype == DType::BF16
            && matches!(
                path,
                GemmPath::CublasLtHighPrecision
                    | GemmPath::CublasLtFp8Tensor
                    | GemmPath::EmulatedBf16
            );
        let (fused_bias, added_bias) = match options.bias {
            Some(bias) => {
                check_bias::<Cube<R, F, I, BT>>(&bias, cols)?;
                if fusable {
                    let bias = Cube::<R, F, I, BT>::float_cast(bias, FloatDType::BF16);
                    (Some(contiguous::<R, F, I, BT>(bias, 1, cols)), None)
                } else {
                    (None, Some(bias))
                }
            }
            None => (None, None),
        };
        let out = client.empty(rows * cols * d_dtype.size());
        prepared.push(prepare(
            kind,
            a,
            b,
            path,
            GemmOutput {
                d: out.clone(),
                d_dtype,
                c,
                bias: fused_bias,
            },
            true,
            options.split_accumulator,
        )?);
        let out = CubeTensor::new_contiguous(
            client.clone(),
            device,
            Shape::new([rows, cols]),
            out,
            d_dtype,
        );
        outputs.push((out, options.out_dtype, true, added_bias));
        group_device.get_or_insert((client, device_index));
    }
    profile::record(GemmPhase::Prepare, called);
    if let Some((client, device_index)) = group_device {
        run_prepared(&client, device_index, prepared)?;
    }
    // Casts (and biases not taken by the epilogue) are queued only now, behind the group's DONE
    // wait on CubeCL's stream.
    let outputs = outputs
        .into_iter()
        .map(|(out, wanted, grouped, bias)| {
            let out = if !grouped || out.dtype() == DType::from(wanted) {
                out
            } else {
                Cube::<R, F, I, BT>::float_cast(out, wanted)
            };
            match bias {
                Some(bias) => crate::backend::ops::rows::add_bias_rows::<Cube<R, F, I, BT>>(
                    out,
                    Cube::<R, F, I, BT>::float_cast(bias, wanted),
                ),
                None => out,
            }
        })
        .collect();
    profile::record(GemmPhase::Call, called);
    Ok(outputs)
}

/// Runs prepared GEMMs as one group (one handshake; `cublaslt::run_group_on_cubecl_buffers`).
pub(crate) fn run_prepared<R: CubeRuntime>(
    client: &ComputeClient<R>,
    device_index: usize,
    prepared: Vec<PreparedGemm<R>>,
) -> Result<()> {
    let handles: Vec<Handle> = prepared.iter().flat_map(|p| p.handles.clone()).collect();
    let buffers: Vec<&Handle> = handles.iter().collect();
    let mut builds = Vec::with_capacity(prepared.len());
    let mut keep = Vec::new();
    for p in prepared {
        builds.push((p.handles.len(), p.build));
        keep.extend(p.keep);
    }
    run_group_on_cubecl_buffers(cuda_client(client), device_index, &buffers, keep, move |ptr| {
        let mut next = 0;
        builds
            .into_iter()
            .map(|(n, build)| {
                let gemm = build(&ptr[next..next + n]);
                next += n;
                gemm
            })
            .collect()
    })
}
