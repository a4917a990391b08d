//! The grouped weight gradient on our K-grouped kernel (`sm90_wgrad`): `dW [E · out, in]` with
//! `dW_e = dY_eᵀ · X_e` in one launch that reads the experts' aligned row offsets on the device,
//! where `grouped::per_group` runs one cuBLASLt GEMM per non-empty expert on the splits' host copy
//! (a read that waits when the copy is late) and fills empty experts' blocks with zeros. Each
//! expert's sum runs over its aligned rows in the kernel's order (fp32 accumulation), as each
//! per-expert GEMM sums them in cuBLASLt's.
//!
//! Taken for BF16 operands (identity storages, dY `[P, out]` and X `[P, in]` as stored) writing
//! f32 or BF16, with or without accumulation into an f32 `main_grad` (`fuse_wgrad_accumulation`:
//! added in place, into a private copy where the buffer is shared), under
//! `GroupedWgrad::Sm90` on sm_90 where `sm90_wgrad::wgrad_fits` and the splits' host copy has
//! arrived (and is valid: bad splits are an error here, as on the per-expert path); anything
//! else returns `None` and takes the per-expert path.

use burn::tensor::ops::FloatTensorOps;
use burn::tensor::{DType, FloatDType, Shape, TensorMetadata};
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::{BoolElement, CubeBackend, CubeRuntime, FloatElement, IntElement};
use burn_lowp_kernels::cubecl::server::Handle;

use super::cublaslt::{run_work_on_cubecl_buffers, GroupWork};
use super::device::{cuda_client, cuda_device};
use super::gemm::{accumulate_input, location};
use super::grouped::whole_tensor;
use super::sm90_wgrad::{grouped_wgrad, wgrad_fits, GroupedWgrad, Sm90GroupedWgrad};
use crate::backend::gemm::{GemmKind, GemmOptions};
use crate::backend::grouped::GroupedOperand;
use crate::backend::quantized::Storage;
use crate::error::Result;

type Cube<R, F, I, BT> = CubeBackend<R, F, I, BT>;

/// The wgrad `[rows, cols] = [E · out, in]` on our kernel, or `None` where it does not apply
/// (module docs): the caller then runs the per-expert GEMMs.
pub(super) fn device_wgrad<R: CubeRuntime, F: FloatElement, I: IntElement, BT: BoolElement>(
    a: GroupedOperand<Cube<R, F, I, BT>>,
    b: GroupedOperand<Cube<R, F, I, BT>>,
    [rows, cols]: [usize; 2],
    options: &GemmOptions<Cube<R, F, I, BT>>,
) -> Result<Option<CubeTensor<R>>> {
    if grouped_wgrad() != GroupedWgrad::Sm90 {
        return Ok(None);
    }
    let (da, db) = GemmKind::Wgrad.directions();
    let (Ok(Storage::HighPrecision(dy)), Ok(Storage::HighPrecision(x)), Some((client, device))) =
        (a.tensor.require(da), b.tensor.require(db), location(a.tensor))
    else {
        return Ok(None);
    };
    let groups = a.groups;
    // The splits are checked on their host copy, as the per-expert path checks them, but only
    // where the copy has arrived (it was requested when the layout was made, in forward): a
    // kernel launched on bad splits would read clamped offsets and return numbers, not the
    // error. Where it has not arrived, the per-expert path runs, which waits for it; that
    // happens at most once a step (the layer whose forward ran last), since the wait leaves
    // the host behind the copies of the layers before it.
    let Some(host) = groups.host.try_get() else {
        return Ok(None);
    };
    host.status.check("m_splits", groups.rows)?;
    let (p, m, n, count) = (a.tensor.rows, a.tensor.cols, b.tensor.cols, groups.count);
    // f32 (optionally accumulated into) or BF16 out; the groups of both operands the same rows.
    let f32 = match options.out_dtype {
        FloatDType::F32 => true,
        FloatDType::BF16 if options.accumulate.is_none() => false,
        _ => return Ok(None),
    };
    let shapes_agree = b.tensor.rows == p
        && b.groups.count == count
        && count > 0
        && rows == count * m
        && cols == n
        && groups.rows == p;
    if !shapes_agree
        || dy.dtype() != DType::BF16
        || x.dtype() != DType::BF16
        || !wgrad_fits(cuda_device::<R>(&device), p, m, n, count)
    {
        return Ok(None);
    }
    let dy = whole_tensor::<R, F, I, BT>(dy, p, m);
    let x = whole_tensor::<R, F, I, BT>(x, p, n);
    let d_dtype = if f32 { DType::F32 } else { DType::BF16 };
    // The output: a fresh buffer, or a private, aligned copy of what it adds to (added in place).
    let (out, accumulating) = match options.accumulate.clone() {
        Some(c) => {
            let c = accumulate_input::<R, F, I, BT>(c, [rows, cols], d_dtype)?;
            let c = if c.handle.can_mut() && c.handle.offset_start.unwrap_or(0) % 16 == 0 {
                c
            } else {
                into_contiguous(Cube::<R, F, I, BT>::float_mul_scalar(c, 1.0f32.into()))
            };
            (c.handle.clone(), Some(c))
        }
        None => (client.empty(rows * cols * d_dtype.size()), None),
    };
    let accumulate = accumulating.is_some();
    let handles: Vec<Handle> = vec![
        dy.handle.clone(),
        x.handle.clone(),
        out.clone(),
        groups.start.handle.clone(),
        groups.len.handle.clone(),
    ];
    let buffers: Vec<&Handle> = handles.iter().collect();
    run_work_on_cubecl_buffers(
        cuda_client(&client),
        cuda_device::<R>(&device),
        &buffers,
        (),
        move |ptr| {
            crate::backend::host_sync::record_device_grouped_wgrad();
            vec![GroupWork::Sm90Wgrad(Sm90GroupedWgrad {
                dy: ptr[0],
                x: ptr[1],
                d: ptr[2],
                rows: p as u64,
                m: m as u32,
                n: n as u32,
                groups: count as u32,
                group_start: ptr[3],
                group_rows: ptr[4],
                f32,
                accumulate,
            })]
        },
    )?;
    drop((dy, x, accumulating));
    Ok(Some(CubeTensor::new_contiguous(
        client,
        device,
        Shape::new([rows, cols]),
        out,
        d_dtype,
    )))
}
