//! `GemmOps`: the three GEMMs of a linear layer on quantized operands, alone or as a group that
//! runs together, and batched float products (attention's `Q·Kᵀ` and `P·V`). The default runs
//! them the generic way: dequantize each operand's representation to f32 and multiply with the
//! backend's matmul (`dequantize_matmul`). That is the GEMM on wgpu and NdArray, and the
//! emulation of MXFP8/NVFP4 on Hopper; CUDA runs FP8 and BF16 GEMMs through cuBLASLt instead
//! (`backend::cuda`).

use burn::tensor::ops::FloatTensor;
use burn::tensor::{FloatDType, Shape, TensorMetadata};

use super::rows::add_bias_rows;
use crate::backend::gemm::{batched_dims, check_bias};
use crate::backend::{
    GemmCall, GemmKind, GemmOptions, GemmPath, LowpBackend, QuantizedTensor, Storage, Transposes,
};
use crate::error::{LowpError, Result};
use crate::format::Direction;

pub trait GemmOps<B: LowpBackend> {
    /// One of a linear layer's GEMMs on quantized operands, each read from the representation
    /// its kind needs (see `GemmKind`). The default dequantizes to f32 and uses the backend's
    /// matmul; CUDA overrides it with cuBLASLt.
    fn gemm_quantized(
        kind: GemmKind,
        a: &QuantizedTensor<B>,
        b: &QuantizedTensor<B>,
        options: GemmOptions<B>,
    ) -> Result<FloatTensor<B>> {
        dequantize_matmul(kind, a, b, FloatDType::F32, options)
    }

    /// GEMMs that run together, such as a layer's dgrad and wgrad (they read the same inputs and
    /// nothing between them depends on the other): the outputs in order. The default runs them one
    /// by one; CUDA orders the whole group against CubeCL's stream with one handshake and spreads
    /// the GEMMs over its streams.
    fn gemm_group(calls: Vec<GemmCall<'_, B>>) -> Result<Vec<FloatTensor<B>>> {
        calls
            .into_iter()
            .map(|c| B::gemm_quantized(c.kind, c.a, c.b, c.options))
            .collect()
    }

    /// The path `gemm_quantized` takes for these operands.
    fn gemm_path(_kind: GemmKind, _a: &QuantizedTensor<B>, _b: &QuantizedTensor<B>) -> GemmPath {
        GemmPath::DequantizeMatmul
    }

    /// `op(a) · op(b)` for `a`, `b` `[batch, rows, cols]` of one float dtype, `t` saying which
    /// enter transposed (`ops/batched_matmul.rs`). The default is Burn's matmul
    /// (`batched_matmul_reference`); CUDA runs one strided-batch cuBLASLt call.
    fn gemm_batched(a: FloatTensor<B>, b: FloatTensor<B>, t: Transposes) -> Result<FloatTensor<B>> {
        batched_matmul_reference::<B>(a, b, t)
    }
}

/// An operand as an f32 `[rows, cols]` tensor (its logical layout) from `direction`.
fn operand<B: LowpBackend>(
    q: &QuantizedTensor<B>,
    direction: Direction,
    dtype: FloatDType,
) -> Result<FloatTensor<B>> {
    let t = match q.require(direction)? {
        Storage::HighPrecision(t) => B::float_reshape(t.clone(), Shape::new([q.rows, q.cols])),
        Storage::Quantized(_) => B::quantize_dequantize(q, direction)?,
    };
    Ok(
        if burn::tensor::TensorMetadata::dtype(&t) == burn::tensor::DType::from(dtype) {
            t
        } else {
            B::float_cast(t, dtype)
        },
    )
}

/// `kind` on `a` and `b` by dequantizing to `compute` dtype and multiplying with the backend's
/// matmul, then casting to `options.out_dtype` and adding `options.accumulate` and `options.bias`.
pub fn dequantize_matmul<B: LowpBackend>(
    kind: GemmKind,
    a: &QuantizedTensor<B>,
    b: &QuantizedTensor<B>,
    compute: FloatDType,
    options: GemmOptions<B>,
) -> Result<FloatTensor<B>> {
    let out_shape = kind.output_shape([a.rows, a.cols], [b.rows, b.cols])?;
    let (da, db) = kind.directions();
    let (a, b) = (operand(a, da, compute)?, operand(b, db, compute)?);
    let product = match kind {
        GemmKind::Fprop => B::float_matmul(a, B::float_transpose(b)),
        GemmKind::Dgrad => B::float_matmul(a, b),
        GemmKind::Wgrad => B::float_matmul(B::float_transpose(a), b),
    };
    let mut out = B::float_cast(product, options.out_dtype);
    if let Some(c) = options.accumulate {
        let c_shape = burn::tensor::TensorMetadata::shape(&c);
        if c_shape.as_slice() != out_shape {
            return Err(LowpError::shape(
                "accumulate",
                format!("{:?}", c_shape.as_slice()),
                format!("the GEMM output is {out_shape:?}"),
            ));
        }
        out = B::float_add(out, B::float_cast(c, options.out_dtype));
    }
    if let Some(bias) = options.bias {
        check_bias::<B>(&bias, out_shape[1])?;
        out = add_bias_rows::<B>(out, B::float_cast(bias, options.out_dtype));
    }
    Ok(out)
}

/// The product with Burn's ops (the default of `gemm_batched`).
pub fn batched_matmul_reference<B: LowpBackend>(
    a: FloatTensor<B>,
    b: FloatTensor<B>,
    t: Transposes,
) -> Result<FloatTensor<B>> {
    batched_dims(&a.shape(), &b.shape(), t)?;
    let a = if t.a { B::float_swap_dims(a, 1, 2) } else { a };
    let b = if t.b { B::float_swap_dims(b, 1, 2) } else { b };
    Ok(B::float_matmul(a, b))
}
