//! A cuBLASLt GEMM as we describe it (`LtGemm`: operands, scales, bias, batches) and its plan:
//! the matmul descriptor and matrix layouts made on a shape's first call and kept (`Plan`, keyed by
//! everything but the pointers, `PlanKey`), each call only pointing the descriptor at its scales.

use std::ffi::c_void;

use cudarc::cublaslt::{result as lt, sys as lts};
use lts::{cublasLtMatmulDescAttributes_t as Attr, cudaDataType_t as DataType};

use super::instance::{lt_error, CublasLt};
use super::ordering::{stream_ordering, StreamOrdering};
use crate::backend::cuda::sm90_grouped::Sm90GroupedGemm;
use crate::error::{LowpError, Result};

/// How an operand's scale is applied (cuBLASLt `CUBLASLT_MATMUL_DESC_{A,B}_SCALE_MODE`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ScaleMode {
    /// One f32 for the whole tensor (FP8 per-tensor scaling).
    Tensor,
    /// f32 per 128 elements along K (`VEC128_32F`), laid out `[K/128][outer]`.
    Vec128,
    /// f32 per 128x128 tile (`BLK128x128_32F`), laid out `[outer/128][roundup(K/128, 4)]`.
    Block128x128,
}

/// One GEMM operand as cuBLASLt sees it (column-major).
#[derive(Debug, Clone, Copy)]
pub struct LtOperand {
    pub ptr: u64,
    pub dtype: DataType,
    /// cuBLAS `op(X) = Xᵀ` (the row-major buffer is `[outer, k]`, K contiguous).
    pub transpose: bool,
    /// Leading dimension (elements).
    pub ld: i64,
    /// Dequantization scale (device pointer) for FP8 operands.
    pub scale: Option<(u64, ScaleMode)>,
}

/// A pointer-array batch of GEMMs of the same shape, one per `chunk_rows`-row chunk of a
/// grouped operand B (and of D): entry c multiplies chunk c of B by A's group g (the group whose
/// rows hold the chunk's first row, `group_start`/`group_len` on the device) into chunk c of D.
/// `LtGemm`'s `a`, `b` and `d` pointers are the bases; `pointers` is device memory for the three
/// arrays (`pointer_array_bytes(capacity)`).
///
/// `capacity` is the host-known bound of chunks (D's chunks); the first `count` of them run and
/// D's chunks from `count` on are zeroed (the tail a grouped matrix defines as zero rows, which
/// the skipped entries would have computed from B's zero rows). The plan (descriptor, layouts,
/// algorithm) is the capacity's, whatever `count` a call runs, so every count runs the same
/// algorithm.
#[derive(Debug, Clone, Copy)]
pub struct LtBatch {
    pub count: u64,
    pub capacity: u64,
    pub chunk_rows: u32,
    pub groups: u32,
    pub group_start: u64,
    pub group_len: u64,
    pub a_group_stride: u64,
    pub b_chunk_stride: u64,
    pub d_chunk_stride: u64,
    pub pointers: u64,
}

/// A strided batch of `count` GEMMs of one shape: entry i reads A at `a + i * a` elements (and
/// B, D likewise); attention's per-head products.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LtStrided {
    pub count: u64,
    pub a: i64,
    pub b: i64,
    pub d: i64,
}

/// Bytes of the three pointer arrays of a batch of `count` entries (each 16-byte aligned).
pub fn pointer_array_bytes(count: usize) -> usize {
    3 * count.div_ceil(2) * 16
}

/// `D (m x n, column-major) = op(A) (m x k) · op(B) (k x n) [+ C]`. Row-major, D is `[n, m]`.
#[derive(Debug, Clone, Copy)]
pub struct LtGemm {
    pub m: u64,
    pub n: u64,
    pub k: u64,
    pub a: LtOperand,
    pub b: LtOperand,
    /// Added to the product (beta = 1); same dtype and layout as D.
    pub c: Option<u64>,
    pub d: u64,
    pub d_dtype: DataType,
    /// cuBLASLt's bias epilogue: a vector of `m` elements of D's dtype added to every column of
    /// D (every row of the row-major output) before D is rounded and written.
    pub bias: Option<u64>,
    /// FP8 fast accumulation (TE: fprop with per-tensor scales only; dgrad/wgrad and block
    /// scaling use the split accumulator).
    pub fast_accum: bool,
    /// A pointer-array batch rather than one GEMM.
    pub batch: Option<LtBatch>,
    /// A strided batch rather than one GEMM (not with `batch`).
    pub strided: Option<LtStrided>,
    /// Time cuBLASLt's candidate algorithms on the first GEMM of this shape (one host wait);
    /// off for shapes that change every step (a group's token count), which take the heuristic's
    /// first choice.
    pub autotune: bool,
}

impl LtGemm {
    pub(super) fn plan_key(&self) -> PlanKey {
        PlanKey {
            m: self.m,
            n: self.n,
            k: self.k,
            a: (
                self.a.dtype,
                self.a.transpose,
                self.a.ld,
                self.a.scale.map(|s| s.1),
            ),
            b: (
                self.b.dtype,
                self.b.transpose,
                self.b.ld,
                self.b.scale.map(|s| s.1),
            ),
            d_dtype: self.d_dtype,
            fast_accum: self.fast_accum,
            has_c: self.c.is_some(),
            has_bias: self.bias.is_some(),
            batch: self.batch.map(|b| b.capacity),
            strided: self.strided,
        }
    }
}

/// One piece of a group's work on our streams: a cuBLASLt GEMM (or batch), or a launch of our
/// Hopper grouped GEMM (`sm90_grouped`), which runs where cuBLASLt would (lane 0 for a group of
/// one), under the same stream ordering.
#[derive(Debug, Clone, Copy)]
pub enum GroupWork {
    Lt(LtGemm),
    Sm90(Sm90GroupedGemm),
}

impl From<LtGemm> for GroupWork {
    fn from(g: LtGemm) -> Self {
        GroupWork::Lt(g)
    }
}

/// What fixes a GEMM's cuBLASLt descriptor, layouts and algorithm: everything but the pointers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) struct PlanKey {
    pub(super) m: u64,
    pub(super) n: u64,
    pub(super) k: u64,
    /// dtype, transpose, leading dimension, scale mode.
    pub(super) a: (DataType, bool, i64, Option<ScaleMode>),
    pub(super) b: (DataType, bool, i64, Option<ScaleMode>),
    pub(super) d_dtype: DataType,
    pub(super) fast_accum: bool,
    pub(super) has_c: bool,
    pub(super) has_bias: bool,
    pub(super) batch: Option<u64>,
    pub(super) strided: Option<LtStrided>,
}

/// A GEMM shape's matmul descriptor, layouts and chosen algorithm, made on its first call and kept
/// (building them cost microseconds of host time per call); each call only sets its scale pointers.
pub(super) struct Plan {
    pub(super) desc: lts::cublasLtMatmulDesc_t,
    pub(super) a: lts::cublasLtMatrixLayout_t,
    pub(super) b: lts::cublasLtMatrixLayout_t,
    pub(super) d: lts::cublasLtMatrixLayout_t,
    pub(super) algo: lts::cublasLtMatmulAlgo_t,
    /// A pointer-array plan's batch count its layouts hold now (see `LtBatch`).
    pub(super) batch_count: Option<u64>,
}

impl Plan {
    /// Sets the layouts' batch count to `count` entries (a cheap host-side attribute).
    pub(super) unsafe fn run_entries(&mut self, count: u64) -> Result<()> {
        if self.batch_count != Some(count) {
            for layout in [self.a, self.b, self.d] {
                unsafe { set_batch_count(layout, count as i32)? };
            }
            self.batch_count = Some(count);
        }
        Ok(())
    }

    /// Destroys what was created (on a failed build).
    pub(super) unsafe fn destroy(desc: lts::cublasLtMatmulDesc_t, layouts: &[lts::cublasLtMatrixLayout_t]) {
        unsafe {
            let _ = lt::destroy_matmul_desc(desc);
            for &layout in layouts {
                let _ = lt::destroy_matrix_layout(layout);
            }
        }
    }
}

pub(super) unsafe fn set<T>(desc: lts::cublasLtMatmulDesc_t, attr: Attr, value: &T) -> Result<()> {
    unsafe {
        lt::set_matmul_desc_attribute(
            desc,
            attr,
            value as *const T as *const c_void,
            std::mem::size_of::<T>(),
        )
    }
    .map_err(lt_error("set matmul attribute"))
}

/// Points the descriptor at this call's dequantization scales and bias (the per-call attributes
/// of a cached `Plan`).
pub(super) unsafe fn set_call_pointers(desc: lts::cublasLtMatmulDesc_t, g: &LtGemm) -> Result<()> {
    for (scale, pointer) in [
        (g.a.scale, Attr::CUBLASLT_MATMUL_DESC_A_SCALE_POINTER),
        (g.b.scale, Attr::CUBLASLT_MATMUL_DESC_B_SCALE_POINTER),
    ] {
        if let Some((ptr, _)) = scale {
            unsafe { set(desc, pointer, &ptr)? };
        }
    }
    if let Some(bias) = g.bias {
        unsafe { set(desc, Attr::CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias)? };
    }
    Ok(())
}

pub(super) fn scale_mode_value(mode: ScaleMode) -> i32 {
    use lts::cublasLtMatmulMatrixScale_t as S;
    (match mode {
        ScaleMode::Tensor => S::CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F,
        ScaleMode::Vec128 => S::CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F,
        ScaleMode::Block128x128 => S::CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F,
    }) as i32
}

/// Marks a matrix layout as a pointer-array batch of `count` entries.
pub(super) unsafe fn set_batched(layout: lts::cublasLtMatrixLayout_t, count: i32) -> Result<()> {
    use lts::cublasLtMatrixLayoutAttribute_t as L;
    let mode = lts::cublasLtBatchMode_t::CUBLASLT_BATCH_MODE_POINTER_ARRAY as i32;
    for (attr, value) in [
        (L::CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, count),
        (L::CUBLASLT_MATRIX_LAYOUT_BATCH_MODE, mode),
    ] {
        unsafe {
            lt::set_matrix_layout_attribute(
                layout,
                attr,
                &value as *const i32 as *const c_void,
                std::mem::size_of::<i32>(),
            )
        }
        .map_err(lt_error("set layout attribute"))?;
    }
    Ok(())
}

/// Sets a pointer-array layout's batch count.
pub(super) unsafe fn set_batch_count(layout: lts::cublasLtMatrixLayout_t, count: i32) -> Result<()> {
    unsafe {
        lt::set_matrix_layout_attribute(
            layout,
            lts::cublasLtMatrixLayoutAttribute_t::CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT,
            &count as *const i32 as *const c_void,
            std::mem::size_of::<i32>(),
        )
    }
    .map_err(lt_error("set layout batch count"))
}

/// Marks a matrix layout as a strided batch of `count` matrices `stride` elements apart.
pub(super) unsafe fn set_strided(layout: lts::cublasLtMatrixLayout_t, count: i32, stride: i64) -> Result<()> {
    use lts::cublasLtMatrixLayoutAttribute_t as L;
    unsafe {
        lt::set_matrix_layout_attribute(
            layout,
            L::CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT,
            &count as *const i32 as *const c_void,
            std::mem::size_of::<i32>(),
        )
        .map_err(lt_error("set layout batch count"))?;
        lt::set_matrix_layout_attribute(
            layout,
            L::CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
            &stride as *const i64 as *const c_void,
            std::mem::size_of::<i64>(),
        )
        .map_err(lt_error("set layout batch stride"))
    }
}

impl CublasLt {
    /// The descriptor, layouts and algorithm of `g`'s shape (see `Plan`).
    pub(super) unsafe fn new_plan(&mut self, lane: usize, g: &LtGemm) -> Result<Plan> {
        let desc = lt::create_matmul_desc(
            lts::cublasComputeType_t::CUBLAS_COMPUTE_32F,
            DataType::CUDA_R_32F,
        )
        .map_err(lt_error("create matmul desc"))?;
        if let Err(e) = unsafe { self.describe(desc, g) } {
            unsafe { Plan::destroy(desc, &[]) };
            return Err(e);
        }
        // Layouts are (rows, cols) of the stored column-major matrix.
        let (a_rows, a_cols) = if g.a.transpose {
            (g.k, g.m)
        } else {
            (g.m, g.k)
        };
        let (b_rows, b_cols) = if g.b.transpose {
            (g.n, g.k)
        } else {
            (g.k, g.n)
        };
        let mut layouts = Vec::with_capacity(3);
        let strides = match g.strided {
            Some(s) => [Some(s.a), Some(s.b), Some(s.d)],
            None => [None; 3],
        };
        let made = [
            (g.a.dtype, a_rows, a_cols, g.a.ld, strides[0], "layout A"),
            (g.b.dtype, b_rows, b_cols, g.b.ld, strides[1], "layout B"),
            (g.d_dtype, g.m, g.n, g.m as i64, strides[2], "layout D"),
        ]
        .into_iter()
        .try_for_each(|(dtype, rows, cols, ld, stride, what)| {
            let layout = lt::create_matrix_layout(dtype, rows, cols, ld).map_err(lt_error(what))?;
            layouts.push(layout);
            match (&g.batch, g.strided, stride) {
                (Some(batch), _, _) => unsafe { set_batched(layout, batch.capacity as i32) },
                (None, Some(strided), Some(stride)) => unsafe {
                    set_strided(layout, strided.count as i32, stride)
                },
                _ => Ok(()),
            }
        });
        let (a, b, d) = match (made, layouts.as_slice()) {
            (Ok(()), &[a, b, d]) => (a, b, d),
            (result, _) => {
                unsafe { Plan::destroy(desc, &layouts) };
                return Err(result.err().unwrap_or_else(|| {
                    LowpError::invalid("cuBLASLt", "layouts", "three matrix layouts")
                }));
            }
        };
        match unsafe { self.choose_algo(lane, desc, g, a, b, d) } {
            Ok(algo) => Ok(Plan {
                desc,
                a,
                b,
                d,
                algo,
                batch_count: g.batch.map(|b| b.capacity),
            }),
            Err(e) => {
                unsafe { Plan::destroy(desc, &layouts) };
                Err(e)
            }
        }
    }

    /// The descriptor attributes fixed by the GEMM's shape and formats (not its pointers).
    pub(super) unsafe fn describe(&self, desc: lts::cublasLtMatmulDesc_t, g: &LtGemm) -> Result<()> {
        unsafe {
            if stream_ordering() == StreamOrdering::DeviceFlags {
                set(desc, Attr::CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET, &self.sm_target)?;
            }
            set(
                desc,
                Attr::CUBLASLT_MATMUL_DESC_TRANSA,
                &(g.a.transpose as i32),
            )?;
            set(
                desc,
                Attr::CUBLASLT_MATMUL_DESC_TRANSB,
                &(g.b.transpose as i32),
            )?;
            for (scale, mode) in [
                (g.a.scale, Attr::CUBLASLT_MATMUL_DESC_A_SCALE_MODE),
                (g.b.scale, Attr::CUBLASLT_MATMUL_DESC_B_SCALE_MODE),
            ] {
                if let Some((_, scale_mode)) = scale {
                    if scale_mode != ScaleMode::Tensor {
                        set(desc, mode, &scale_mode_value(scale_mode))?;
                    }
                }
            }
            // (FP8 on unit scales, e.g. a pointer array whose per-group scales are applied
            // after it, asks for fast accumulation too.)
            if g.a.scale.is_some() || g.fast_accum {
                set(
                    desc,
                    Attr::CUBLASLT_MATMUL_DESC_FAST_ACCUM,
                    &(g.fast_accum as i8),
                )?;
            }
            if g.bias.is_some() {
                let epilogue = lts::cublasLtEpilogue_t::CUBLASLT_EPILOGUE_BIAS as u32;
                set(desc, Attr::CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue)?;
                set(desc, Attr::CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &(g.d_dtype as i32))?;
            }
            // The heuristic and the timing runs read the scale and bias pointers too.
            set_call_pointers(desc, g)
        }
    }
}
