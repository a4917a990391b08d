//! The buffers CubeCL kernels read and write, shared by every op on `CubeBackend`: the device
//! byte buffer (`CubeBytes`), a float tensor made contiguous and aligned for the kernels
//! (`prepare`), kernel output handles wrapped as device bytes or tensors, Int labels as i32, and
//! the kernels' error and element kinds mapped to burn-lowp's.

use burn::tensor::ops::{FloatTensorOps, IntTensor, IntTensorOps};
use burn::tensor::TensorMetadata;
use burn::tensor::{DType, IntDType, Shape};
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::{BoolElement, CubeBackend, CubeRuntime, FloatElement, IntElement};
use burn_lowp_kernels as kernels;
use burn_lowp_kernels::cubecl::prelude::*;
use burn_lowp_kernels::cubecl::server::Handle;
use kernels::{ElemKind, KernelError};

use crate::error::{LowpError, Result};

/// A device byte buffer: a CubeCL handle and its length in bytes.
#[derive(Clone)]
pub struct CubeBytes<R: CubeRuntime> {
    pub client: ComputeClient<R>,
    pub device: R::Device,
    pub handle: Handle,
    pub len: usize,
}

impl<R: CubeRuntime> std::fmt::Debug for CubeBytes<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CubeBytes({} bytes)", self.len)
    }
}

/// A contiguous tensor whose data starts 16-byte aligned (the kernels load 16-byte vectors).
pub(crate) fn prepare<R: CubeRuntime>(x: CubeTensor<R>) -> CubeTensor<R> {
    let x = into_contiguous(x);
    if x.handle.offset_start.unwrap_or(0) % 16 == 0 {
        x
    } else {
        // A view into a larger buffer at an unaligned offset: copy it (x * 1 is exact).
        let copy = CubeBackend::<R, f32, i32, u32>::float_mul_scalar(x, 1.0f32.into());
        into_contiguous(copy)
    }
}

pub(crate) fn bytes<R: CubeRuntime>(
    client: &ComputeClient<R>,
    device: &R::Device,
    handle: Handle,
    len: usize,
) -> CubeBytes<R> {
    CubeBytes {
        device: device.clone(),
        client: client.clone(),
        handle,
        len,
    }
}

pub(crate) fn float_tensor<R: CubeRuntime>(
    client: &ComputeClient<R>,
    device: &R::Device,
    handle: Handle,
    rows: usize,
    cols: usize,
) -> CubeTensor<R> {
    CubeTensor::new_contiguous(
        client.clone(),
        device.clone(),
        Shape::new([rows, cols]),
        handle,
        DType::F32,
    )
}

pub(crate) fn f32_tensor<R: CubeRuntime>(
    like: &CubeTensor<R>,
    handle: kernels::cubecl::server::Handle,
    shape: Vec<usize>,
) -> CubeTensor<R> {
    CubeTensor::new_contiguous(
        like.client.clone(),
        like.device.clone(),
        Shape::from(shape),
        handle,
        DType::F32,
    )
}

pub(crate) fn like<R: CubeRuntime>(
    t: &CubeTensor<R>,
    handle: kernels::cubecl::server::Handle,
    shape: [usize; 2],
) -> CubeTensor<R> {
    CubeTensor::new_contiguous(
        t.client.clone(),
        t.device.clone(),
        Shape::new(shape),
        handle,
        t.dtype,
    )
}

/// Row labels as a contiguous i32 tensor (the stats and grouped dequantize kernels read i32).
pub(crate) fn i32_labels<R: CubeRuntime, F: FloatElement, I: IntElement, BT: BoolElement>(
    t: IntTensor<CubeBackend<R, F, I, BT>>,
) -> CubeTensor<R> {
    let t = if t.dtype == DType::I32 {
        t
    } else {
        CubeBackend::<R, F, I, BT>::int_cast(t, IntDType::I32)
    };
    // (Labels are whole tensors, never views at an offset.)
    into_contiguous(t)
}

pub(crate) fn elem_kind(dtype: DType, tensor: &str) -> Result<ElemKind> {
    match dtype {
        DType::F32 => Ok(ElemKind::F32),
        DType::F16 => Ok(ElemKind::F16),
        DType::BF16 => Ok(ElemKind::BF16),
        other => Err(LowpError::Dtype {
            tensor: tensor.to_string(),
            dtype: format!("{other:?}"),
            supported: "quantize kernels read F32, F16 and BF16".to_string(),
        }),
    }
}

pub(crate) fn kernel_error(tensor: &str) -> impl Fn(KernelError) -> LowpError + '_ {
    move |e| LowpError::shape(tensor, e.value, e.rule)
}

/// The row-index type of an Int tensor the row kernels read (`row_gather`, `group_epilogue`).
pub(crate) fn index_kind(dtype: DType) -> Option<kernels::row_gather::IndexKind> {
    match dtype {
        DType::I32 => Some(kernels::row_gather::IndexKind::I32),
        DType::I64 => Some(kernels::row_gather::IndexKind::I64),
        _ => None,
    }
}

pub(crate) fn matrix<R: CubeRuntime>(t: &CubeTensor<R>, what: &str) -> Result<(usize, usize)> {
    let dims = t.shape().as_slice().to_vec();
    if dims.len() != 2 {
        return Err(LowpError::shape(
            what,
            format!("{dims:?}"),
            "the elementwise passes take [rows, cols] matrices",
        ));
    }
    Ok((dims[0], dims[1]))
}

pub(crate) fn same_dtype<R: CubeRuntime>(t: &CubeTensor<R>, dtype: DType, what: &str) -> Result<()> {
    if t.dtype != dtype {
        return Err(LowpError::Dtype {
            tensor: what.to_string(),
            dtype: format!("{:?}", t.dtype),
            supported: format!("the input's dtype {dtype:?}"),
        });
    }
    Ok(())
}
