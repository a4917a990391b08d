//! The aligned layout of a token batch on `CubeBackend` (`GroupedOps::grouped_layout`): one kernel
//! makes it from the device split sizes (`kernels::group_layout`), and the splits' host copy is
//! requested at once, resolved by its first reader, by a probe on CUDA that tells it has arrived,
//! or by a resolver thread (`host_copy::SplitCopy`).

use burn::tensor::ops::{IntTensor, IntTensorOps};
use burn::tensor::{DType, IntDType, Shape, TensorMetadata};
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::{BoolElement, CubeBackend as Cube, CubeRuntime, FloatElement, IntElement};
use burn_lowp_kernels as kernels;
use burn_lowp_kernels::cubecl::server::Handle;

use super::buffers::bytes;
use super::host_read::host_read_later;
use crate::backend::grouped::{aligned_rows, HostCopy, HostGroups, GROUP_ALIGN};
use crate::backend::host_copy::{split_copy, SplitCopy};
use crate::backend::{GroupLayout, Groups, RowGroup};
use crate::error::{LowpError, Result};
use crate::format::grouped::SplitStatus;

/// The aligned layout of `tokens` packed tokens split by the device `m_splits`, made on the
/// device; the splits' host copy is requested here.
pub(crate) fn group_layout<R: CubeRuntime, F: FloatElement, I: IntElement, BT: BoolElement>(
    m_splits: IntTensor<Cube<R, F, I, BT>>,
    tokens: usize,
) -> Result<GroupLayout<Cube<R, F, I, BT>>> {
    let shape = m_splits.shape();
    if shape.num_dims() != 1 || shape.as_slice()[0] == 0 {
        return Err(LowpError::shape(
            "m_splits",
            format!("shape {:?}", shape.as_slice()),
            "one split size per group, at least one group",
        ));
    }
    let count = shape.as_slice()[0];
    let splits = into_contiguous(Cube::<R, F, I, BT>::int_cast(m_splits, IntDType::I32));
    let (client, device) = (splits.client.clone(), splits.device.clone());
    let buffers = kernels::group_layout::group_layout(
        &client,
        &splits.handle,
        count,
        tokens,
        GROUP_ALIGN,
    );
    let rows = aligned_rows(tokens, count);
    let int = |handle: Handle, len: usize| {
        let t = CubeTensor::new_contiguous(
            client.clone(),
            device.clone(),
            Shape::new([len]),
            handle,
            DType::I32,
        );
        if I::dtype() == DType::I32 {
            t
        } else {
            Cube::<R, F, I, BT>::int_cast(t, IntDType::from(I::dtype()))
        }
    };
    let words = |h: &Handle, n: usize| bytes(&client, &device, h.clone(), 4 * n);
    let (start, len) = (words(&buffers.group_start, count), words(&buffers.group_rows, count));
    #[cfg(feature = "cuda")]
    let background = crate::backend::cuda::is_cuda::<R>() && split_copy() == SplitCopy::Background;
    #[cfg(not(feature = "cuda"))]
    let background = false;
    let (later, arrived) = host_read_later(
        vec![
            start.clone(),
            len.clone(),
            words(&buffers.group_tokens, count),
            words(&buffers.status, kernels::group_layout::STATUS_WORDS),
        ],
        !background && split_copy() == SplitCopy::OnRead,
    );
    // On CUDA, with `LOWP_SPLIT_COPY=background`, a resolver thread takes the copy as soon as
    // it arrives, so that the grouped GEMMs see the splits as early as possible; by default
    // the first reader resolves it (`host_copy::SplitCopy`), or, on CUDA, the first `try_get`
    // after a mark on the stream says the copy has arrived (which takes no wait).
    let resolve = move || {
        let read = later()?;
        let u32s = |b: &Vec<u8>| {
            b.chunks_exact(4)
                .map(|w| u32::from_le_bytes([w[0], w[1], w[2], w[3]]) as usize)
                .collect::<Vec<_>>()
        };
        let (start, len, used, status) = (u32s(&read[0]), u32s(&read[1]), u32s(&read[2]), u32s(&read[3]));
        Ok(HostGroups {
            groups: (0..count)
                .map(|g| RowGroup {
                    start: start[g],
                    len: len[g],
                    used: used[g],
                })
                .collect(),
            status: SplitStatus::from_words([status[0] as u32, status[1] as u32, status[2] as u32]),
        })
    };
    let host = match (background, arrived) {
        (true, _) => HostCopy::in_background(resolve),
        (false, Some(arrived)) => HostCopy::pending_probed(resolve, arrived),
        (false, None) => HostCopy::pending(resolve),
    };
    Ok(GroupLayout {
        groups: Groups {
            count,
            rows,
            start,
            len,
            host,
        },
        tokens,
        row_group: int(buffers.row_group, rows),
        aligned_to_packed: int(buffers.aligned_to_packed, rows),
        packed_to_aligned: int(buffers.packed_to_aligned, tokens),
    })
}
