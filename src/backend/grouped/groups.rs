//! Grouped (MoE) matrices on a backend: where the groups lie (`Groups`, on the device and, once
//! read, on the host), the layout of a token batch split by device-resident split sizes
//! (`GroupLayout`), and views of one group of a grouped quantized tensor. The layouts are
//! specified in `format::grouped`.

use std::ops::Range;

use burn::tensor::ops::IntTensor;
use burn::tensor::{Tensor, TensorPrimitive};

use crate::backend::host_copy::HostCopy;
use crate::backend::{LowpBackend, QuantizedStorage, QuantizedTensor, Storage, StorageScales};
use crate::error::{LowpError, Result};
use crate::format::grouped::{group_ranges, RowGroup, SplitStatus};
use crate::format::{codes_shape, scales_shape, Direction};

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

