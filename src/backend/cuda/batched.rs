//! `GemmOps::gemm_batched` on CUDA: one cuBLASLt call with a strided batch
//! (`LtStrided`) in the operands' dtype (F32, F16 or BF16; f32 accumulation), through the same
//! ordering handshake as every other GEMM.
//!
//! Row-major `C [m, n] = op(A) [m, k] · op(B) [k, n]` is column-major `Cᵀ = op(B)ᵀ · op(A)ᵀ`:
//! cuBLAS's A is our `b` (`m_lt = n`) and its B is our `a` (`n_lt = m`). A row-major matrix read
//! column-major is its transpose, so a stored `b [k, n]` is already `op(B)ᵀ` (no transpose,
//! leading dimension n) and a stored `bᵀ [n, k]` needs cuBLAS's transpose (leading dimension k);
//! likewise for `a`.

use burn::tensor::{DType, Shape, TensorMetadata};
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::{BoolElement, CubeRuntime, FloatElement, IntElement};
use burn_lowp_kernels::cubecl::server::Handle;

use super::cublaslt::{run_on_cubecl_buffers, LtGemm, LtOperand, LtStrided};
use super::device::{cuda_client, cuda_device};
use super::gemm::{contiguous, data_type};
use crate::error::{LowpError, Result};
use crate::backend::gemm::{batched_dims, Transposes};

/// `op(a) · op(b)` for `a`, `b` `[batch, rows, cols]` of one float dtype (`R` must be
/// `CudaRuntime`); the result is `[batch, m, n]` in that dtype.
pub fn batched_matmul<R: CubeRuntime, F: FloatElement, I: IntElement, BT: BoolElement>(
    a: CubeTensor<R>,
    b: CubeTensor<R>,
    t: Transposes,
) -> Result<CubeTensor<R>> {
    let (batch, m, k, n) = batched_dims(&a.shape(), &b.shape(), t)?;
    let dtype = a.dtype();
    if !matches!(dtype, DType::F32 | DType::F16 | DType::BF16) || b.dtype() != dtype {
        return Err(LowpError::invalid(
            "batched matmul operands",
            format!("{dtype:?} and {:?}", b.dtype()),
            "cuBLASLt multiplies two F32, F16 or BF16 operands of one dtype",
        ));
    }
    let (client, device) = (a.client.clone(), a.device.clone());
    let [a_rows, a_cols] = if t.a { [k, m] } else { [m, k] };
    let [b_rows, b_cols] = if t.b { [n, k] } else { [k, n] };
    let a = contiguous::<R, F, I, BT>(a, batch * a_rows, a_cols);
    let b = contiguous::<R, F, I, BT>(b, batch * b_rows, b_cols);
    let out = client.empty(batch * m * n * dtype.size());
    let handles: [Handle; 3] = [b.handle.clone(), a.handle.clone(), out.clone()];
    let buffers: Vec<&Handle> = handles.iter().collect();
    let lt_type = data_type(dtype);
    run_on_cubecl_buffers(
        cuda_client(&client),
        cuda_device::<R>(&device),
        &buffers,
        move |ptr| LtGemm {
            m: n as u64,
            n: m as u64,
            k: k as u64,
            // cuBLAS A = b: stored [k, n] is op N with ld n; stored [n, k] is op T with ld k.
            a: LtOperand {
                ptr: ptr[0],
                dtype: lt_type,
                transpose: t.b,
                ld: if t.b { k } else { n } as i64,
                scale: None,
            },
            // cuBLAS B = a: stored [m, k] is op N with ld k; stored [k, m] is op T with ld m.
            b: LtOperand {
                ptr: ptr[1],
                dtype: lt_type,
                transpose: t.a,
                ld: if t.a { m } else { k } as i64,
                scale: None,
            },
            c: None,
            d: ptr[2],
            d_dtype: lt_type,
            bias: None,
            fast_accum: false,
            batch: None,
            strided: (batch > 1).then_some(LtStrided {
                count: batch as u64,
                a: (n * k) as i64,
                b: (m * k) as i64,
                d: (m * n) as i64,
            }),
            autotune: true,
        },
    )?;
    drop((a, b));
    Ok(CubeTensor::new_contiguous(
        client,
        device,
        Shape::new([batch, m, n]),
        out,
        dtype,
    ))
}
