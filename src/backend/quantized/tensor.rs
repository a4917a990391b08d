//! `QuantizedTensor<B>`: a logical `[rows, cols]` shape and optional rowwise and columnwise
//! storages. It lives in `backend` because the backend ops produce and read it (`quant`, which
//! makes it through quantizers, re-exports it). A storage is either quantized (device bytes for
//! codes, scales and amax, in its own format: the two directions of a hybrid tensor differ) or the
//! high-precision tensor itself (identity). A quantized storage is the device twin of
//! `format::QuantizedData`, with the same layouts (see `format::quantized`).

use burn::tensor::ops::FloatTensor;

use crate::backend::LowpBackend;
use crate::error::{LowpError, Result};
use crate::format::{
    Direction, HostQuantized, QuantFormat, QuantizedData, ScaleLayout, Scales, Usage,
};

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

/// One quantized representation (rowwise or columnwise).
#[derive(Debug, Clone)]
pub struct QuantizedStorage<B: LowpBackend> {
    pub format: QuantFormat,
    pub codes: B::Bytes,
    /// Shape of the codes in bytes.
    pub codes_shape: [usize; 2],
    pub scales: StorageScales<B>,
    /// f32 amax where the format keeps one (FP8 per-tensor, NVFP4).
    pub amax: Option<B::Bytes>,
    /// A grouped FP8 per-tensor storage whose per-group `scale_inv` values are all one shared
    /// value (`format::grouped::GroupScaling::Shared`): a grouped GEMM may apply the first as the
    /// whole operand's scale.
    pub shared_scale: bool,
}

/// One representation of a tensor.
#[derive(Debug, Clone)]
pub enum Storage<B: LowpBackend> {
    Quantized(QuantizedStorage<B>),
    /// Identity quantization: the high-precision `[rows, cols]` tensor, consumed as is.
    HighPrecision(FloatTensor<B>),
}

/// A quantized 2D tensor on backend `B`.
#[derive(Debug, Clone)]
pub struct QuantizedTensor<B: LowpBackend> {
    pub rows: usize,
    pub cols: usize,
    pub rowwise: Option<Storage<B>>,
    pub columnwise: Option<Storage<B>>,
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
    /// Copies the storage to the host (a synchronizing read on device backends).
    pub fn to_host(&self) -> QuantizedData {
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

    /// This storage as a one-direction host tensor of the `[rows, cols]` matrix.
    pub fn to_host_tensor(&self, rows: usize, cols: usize, direction: Direction) -> HostQuantized {
        let data = Some(self.to_host());
        let (rowwise, columnwise) = match direction {
            Direction::Rowwise => (data, None),
            Direction::Columnwise => (None, data),
        };
        HostQuantized {
            format: self.format,
            rows,
            cols,
            rowwise,
            columnwise,
        }
    }

    pub fn from_host(
        format: QuantFormat,
        data: &QuantizedData,
        upload: &impl Fn(Vec<u8>) -> B::Bytes,
    ) -> Self {
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
            format,
            codes: upload(data.codes.clone()),
            codes_shape: data.codes_shape,
            scales,
            amax: data.amax.map(|a| upload(f32_to_bytes(&[a]))),
            shared_scale: false,
        }
    }
}

impl<B: LowpBackend> QuantizedTensor<B> {
    /// Marks its FP8 per-tensor storages as holding one scale shared by all groups (the grouped
    /// quantizers' `GroupScaling::Shared`, which wrote them so).
    pub fn with_shared_scale(mut self) -> Self {
        for side in [&mut self.rowwise, &mut self.columnwise] {
            if let Some(Storage::Quantized(s)) = side {
                if matches!(s.format, QuantFormat::Fp8Tensor { .. }) {
                    s.shared_scale = true;
                }
            }
        }
        self
    }

    pub fn storage(&self, direction: Direction) -> Option<&Storage<B>> {
        match direction {
            Direction::Rowwise => self.rowwise.as_ref(),
            Direction::Columnwise => self.columnwise.as_ref(),
        }
    }

    /// The storage of `direction`, or an error naming what is missing.
    pub fn require(&self, direction: Direction) -> Result<&Storage<B>> {
        self.storage(direction).ok_or_else(|| {
            LowpError::invalid(
                "direction",
                direction.name(),
                format!(
                    "this [{}, {}] tensor holds no {} data",
                    self.rows,
                    self.cols,
                    direction.name()
                ),
            )
        })
    }

    /// The quantized storage of `direction` (an error for a missing or identity one).
    pub fn quantized(&self, direction: Direction) -> Result<&QuantizedStorage<B>> {
        match self.require(direction)? {
            Storage::Quantized(q) => Ok(q),
            Storage::HighPrecision(_) => Err(LowpError::invalid(
                "direction",
                direction.name(),
                "holds the high-precision tensor (identity quantization), not codes",
            )),
        }
    }

    /// Which representations this tensor holds.
    pub fn usage(&self) -> Usage {
        Usage {
            rowwise: self.rowwise.is_some(),
            columnwise: self.columnwise.is_some(),
        }
    }

    /// Drops the representations `usage` does not ask for (to save memory once they are consumed,
    /// e.g. the rowwise copy of a saved activation after the forward GEMM). Asking for one the
    /// tensor does not hold is an error: it cannot be rebuilt from the other.
    pub fn narrow(mut self, usage: Usage) -> Result<Self> {
        for (wanted, held, direction) in [
            (usage.rowwise, self.rowwise.is_some(), Direction::Rowwise),
            (
                usage.columnwise,
                self.columnwise.is_some(),
                Direction::Columnwise,
            ),
        ] {
            if wanted && !held {
                return Err(LowpError::invalid(
                    "usage",
                    direction.name(),
                    "narrowing can only drop representations, and this one is not held",
                ));
            }
        }
        if !usage.rowwise {
            self.rowwise = None;
        }
        if !usage.columnwise {
            self.columnwise = None;
        }
        Ok(self)
    }

    /// Copies every buffer to the host (a synchronizing read on device backends). Both held
    /// storages must be quantized in one format.
    pub fn to_host(&self) -> Result<HostQuantized> {
        let mut format = None;
        let mut side = |direction| -> Result<Option<QuantizedData>> {
            if self.storage(direction).is_none() {
                return Ok(None);
            }
            let storage = self.quantized(direction)?;
            if format.is_some_and(|f| f != storage.format) {
                return Err(LowpError::invalid(
                    "to_host",
                    storage.format.name(),
                    "the two directions are in different formats (a hybrid tensor): read each storage",
                ));
            }
            format = Some(storage.format);
            Ok(Some(storage.to_host()))
        };
        let rowwise = side(Direction::Rowwise)?;
        let columnwise = side(Direction::Columnwise)?;
        let format = format.ok_or_else(|| {
            LowpError::invalid("to_host", "empty", "the tensor holds no representation")
        })?;
        Ok(HostQuantized {
            format,
            rows: self.rows,
            cols: self.cols,
            rowwise,
            columnwise,
        })
    }

    /// Builds a quantized tensor from host bytes, uploading each buffer with `upload`.
    pub fn from_host(host: &HostQuantized, upload: impl Fn(Vec<u8>) -> B::Bytes) -> Self {
        let side = |d: &Option<QuantizedData>| {
            d.as_ref()
                .map(|d| Storage::Quantized(QuantizedStorage::from_host(host.format, d, &upload)))
        };
        QuantizedTensor {
            rows: host.rows,
            cols: host.cols,
            rowwise: side(&host.rowwise),
            columnwise: side(&host.columnwise),
        }
    }
}
