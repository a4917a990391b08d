//! `QuantizedTensor<B>`: a logical `[rows, cols]` shape and optional rowwise and columnwise
//! storages, each holding device bytes for codes, scales and amax. It is the device twin of
//! `format::HostQuantized`, with the same layouts (see `format::quantized`).

use crate::backend::LowpBackend;
use crate::error::{LowpError, Result};
use crate::format::{Direction, HostQuantized, QuantFormat, QuantizedData, ScaleLayout, Scales};

/// Scales of one storage, in device bytes.
#[derive(Debug, Clone)]
pub enum StorageScales<B: LowpBackend> {
    /// FP8 per-tensor: one f32 `scale_inv`.
    TensorScaleInv(B::Bytes),
    /// FP8 block: f32 `scale_inv` per block, `shape` row-major.
    BlockF32 { shape: [usize; 2], bytes: B::Bytes },
    /// MXFP8 E8M0 / NVFP4 E4M3 bytes; `shape` is the padded compact shape.
    BlockBytes {
        shape: [usize; 2],
        bytes: B::Bytes,
        layout: ScaleLayout,
    },
}

/// One representation (rowwise or columnwise).
#[derive(Debug, Clone)]
pub struct QuantizedStorage<B: LowpBackend> {
    pub codes: B::Bytes,
    /// Shape of the codes in bytes.
    pub codes_shape: [usize; 2],
    pub scales: StorageScales<B>,
    /// f32 amax where the format keeps one (FP8 per-tensor, NVFP4).
    pub amax: Option<B::Bytes>,
}

/// A quantized 2D tensor on backend `B`.
#[derive(Debug, Clone)]
pub struct QuantizedTensor<B: LowpBackend> {
    pub format: QuantFormat,
    pub rows: usize,
    pub cols: usize,
    pub rowwise: Option<QuantizedStorage<B>>,
    pub columnwise: Option<QuantizedStorage<B>>,
}

fn f32_from_bytes(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}

fn f32_to_bytes(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

impl<B: LowpBackend> QuantizedStorage<B> {
    fn to_host(&self) -> QuantizedData {
        let read = |b: &B::Bytes| B::bytes_to_host(b);
        let scales = match &self.scales {
            StorageScales::TensorScaleInv(b) => Scales::TensorScaleInv(f32_from_bytes(&read(b))[0]),
            StorageScales::BlockF32 { shape, bytes } => Scales::BlockF32 {
                shape: *shape,
                values: f32_from_bytes(&read(bytes)),
            },
            StorageScales::BlockBytes {
                shape,
                bytes,
                layout,
            } => Scales::BlockBytes {
                shape: *shape,
                bytes: read(bytes),
                layout: *layout,
            },
        };
        QuantizedData {
            codes: read(&self.codes),
            codes_shape: self.codes_shape,
            scales,
            amax: self.amax.as_ref().map(|a| f32_from_bytes(&read(a))[0]),
        }
    }

    fn from_host(data: &QuantizedData, upload: &impl Fn(Vec<u8>) -> B::Bytes) -> Self {
        let scales = match &data.scales {
            Scales::TensorScaleInv(s) => StorageScales::TensorScaleInv(upload(f32_to_bytes(&[*s]))),
            Scales::BlockF32 { shape, values } => StorageScales::BlockF32 {
                shape: *shape,
                bytes: upload(f32_to_bytes(values)),
            },
            Scales::BlockBytes {
                shape,
                bytes,
                layout,
            } => StorageScales::BlockBytes {
                shape: *shape,
                bytes: upload(bytes.clone()),
                layout: *layout,
            },
        };
        QuantizedStorage {
            codes: upload(data.codes.clone()),
            codes_shape: data.codes_shape,
            scales,
            amax: data.amax.map(|a| upload(f32_to_bytes(&[a]))),
        }
    }
}

impl<B: LowpBackend> QuantizedTensor<B> {
    pub fn storage(&self, direction: Direction) -> Option<&QuantizedStorage<B>> {
        match direction {
            Direction::Rowwise => self.rowwise.as_ref(),
            Direction::Columnwise => self.columnwise.as_ref(),
        }
    }

    /// The storage of `direction`, or an error naming what is missing.
    pub fn require(&self, direction: Direction) -> Result<&QuantizedStorage<B>> {
        self.storage(direction).ok_or_else(|| {
            LowpError::invalid(
                "direction",
                direction.name(),
                format!(
                    "this {} tensor holds no {} data",
                    self.format.name(),
                    direction.name()
                ),
            )
        })
    }

    /// Copies every buffer to the host (a synchronizing read on device backends).
    pub fn to_host(&self) -> HostQuantized {
        HostQuantized {
            format: self.format,
            rows: self.rows,
            cols: self.cols,
            rowwise: self.rowwise.as_ref().map(|s| s.to_host()),
            columnwise: self.columnwise.as_ref().map(|s| s.to_host()),
        }
    }

    /// Builds a quantized tensor from host bytes, uploading each buffer with `upload`.
    pub fn from_host(host: &HostQuantized, upload: impl Fn(Vec<u8>) -> B::Bytes) -> Self {
        QuantizedTensor {
            format: host.format,
            rows: host.rows,
            cols: host.cols,
            rowwise: host
                .rowwise
                .as_ref()
                .map(|d| QuantizedStorage::from_host(d, &upload)),
            columnwise: host
                .columnwise
                .as_ref()
                .map(|d| QuantizedStorage::from_host(d, &upload)),
        }
    }
}
