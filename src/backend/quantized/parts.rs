//! Quantized storages as Burn tensors (`QuantizedParts`): codes as a `U8` Int tensor, scales as an
//! f32 float tensor (FP8 per-tensor and block) or a `U8` Int tensor (MXFP8 E8M0, NVFP4 E4M3 bytes),
//! the amax as an f32 tensor, and the format as plain metadata. Every format converts, NVFP4 and
//! the two directions of a hybrid tensor included (`QuantizedTensorParts`), since nothing here asks
//! Burn to understand the codes: that is what `burn_native`'s `QFloat` tensors do, for the formats
//! Burn 0.21 can dequantize.
//!
//! Being Burn tensors, the parts move with Burn's `to_device` and save in Burn records
//! (`Record` below: the codes and byte scales stay `U8` bytes on disk, the f32 scales f32). On
//! CubeCL backends the conversion shares the device buffers both ways (no copy, no host read);
//! NdArray's storages are host bytes already.

use burn::record::{PrecisionSettings, Record};
use burn::tensor::{DType, Int, Tensor, TensorData, TensorPrimitive};
use serde::{Deserialize, Serialize};

use super::tensor::{QuantizedStorage, QuantizedTensor, Storage, StorageScales};
use crate::backend::LowpBackend;
use crate::error::{LowpError, Result};
use crate::format::{codes_shape, scales_shape, Direction, QuantFormat, ScaleLayout};

/// The scales of one storage as Burn tensors.
#[derive(Debug, Clone)]
pub enum ScaleParts<B: LowpBackend> {
    /// FP8 per-tensor: the f32 `scale_inv` (one value; one per group in grouped storages).
    TensorScaleInv(Tensor<B, 1>),
    /// FP8 block: f32 `scale_inv` per block, row-major `[block rows, block cols]`.
    BlockF32(Tensor<B, 2>),
    /// MXFP8 E8M0 / NVFP4 E4M3 scale bytes, `U8` in the padded compact shape, in `layout`.
    BlockBytes {
        bytes: Tensor<B, 2, Int>,
        layout: ScaleLayout,
    },
}

/// One quantized storage (rowwise or columnwise) as Burn tensors.
#[derive(Debug, Clone)]
pub struct QuantizedParts<B: LowpBackend> {
    pub format: QuantFormat,
    /// The codes' bytes, `U8`, in the storage's codes shape (FP4: two codes a byte).
    pub codes: Tensor<B, 2, Int>,
    pub scales: ScaleParts<B>,
    /// The f32 amax, where the format keeps one (FP8 per-tensor, NVFP4).
    pub amax: Option<Tensor<B, 1>>,
    /// See `QuantizedStorage::shared_scale`.
    pub shared_scale: bool,
}

fn float<B: LowpBackend, const D: usize>(bytes: &B::Bytes, shape: [usize; 2]) -> Tensor<B, D> {
    let t: Tensor<B, 2> =
        Tensor::from_primitive(TensorPrimitive::Float(B::bytes_as_float(bytes, shape)));
    t.reshape(shape_of::<D>(shape))
}

fn shape_of<const D: usize>(shape: [usize; 2]) -> [usize; D] {
    match D {
        1 => [shape[0] * shape[1]; D],
        _ => std::array::from_fn(|i| shape[i]),
    }
}

fn u8_tensor<B: LowpBackend>(bytes: &B::Bytes, shape: [usize; 2]) -> Tensor<B, 2, Int> {
    Tensor::from_primitive(B::bytes_as_u8(bytes, shape))
}

fn f32_bytes<B: LowpBackend, const D: usize>(t: Tensor<B, D>, what: &str) -> Result<B::Bytes> {
    B::f32_into_bytes(t.into_primitive().tensor(), what)
}

fn check_dims(what: String, have: &[usize], want: &[usize]) -> Result<()> {
    if have != want {
        return Err(LowpError::shape(
            what,
            format!("{have:?}"),
            format!("the format and the tensor's shape need {want:?}"),
        ));
    }
    Ok(())
}

impl<B: LowpBackend> QuantizedParts<B> {
    /// The storage's buffers as Burn tensors (shared with the storage on CubeCL backends).
    pub fn from_storage(storage: &QuantizedStorage<B>) -> Self {
        let scales = match &storage.scales {
            StorageScales::TensorScaleInv(b) => {
                ScaleParts::TensorScaleInv(float(b, [1, B::bytes_len(b) / 4]))
            }
            StorageScales::BlockF32 { shape, bytes } => ScaleParts::BlockF32(float(bytes, *shape)),
            StorageScales::BlockBytes {
                shape,
                bytes,
                layout,
            } => ScaleParts::BlockBytes {
                bytes: u8_tensor(bytes, *shape),
                layout: *layout,
            },
        };
        QuantizedParts {
            format: storage.format,
            codes: u8_tensor(&storage.codes, storage.codes_shape),
            scales,
            amax: storage
                .amax
                .as_ref()
                .map(|a| float(a, [1, B::bytes_len(a) / 4])),
            shared_scale: storage.shared_scale,
        }
    }

    /// The storage back, its buffers the tensors' own where the backend can share them. The
    /// shapes and dtypes are checked against the format (`U8` codes and byte scales, f32 scales):
    /// a mismatch is an error naming the tensor.
    pub fn into_storage(self) -> Result<QuantizedStorage<B>> {
        let codes_shape: [usize; 2] = self.codes.dims();
        let expect_scales = |kind: &str| {
            LowpError::invalid(
                "scales",
                kind.to_string(),
                format!(
                    "{} keeps {}",
                    self.format.name(),
                    match self.format {
                        QuantFormat::Fp8Tensor { .. } => "one f32 scale_inv (TensorScaleInv)",
                        QuantFormat::Fp8Block { .. } => "f32 block scales (BlockF32)",
                        _ => "scale bytes (BlockBytes)",
                    }
                ),
            )
        };
        let scales = match (self.scales, self.format) {
            (ScaleParts::TensorScaleInv(s), QuantFormat::Fp8Tensor { .. }) => {
                StorageScales::TensorScaleInv(f32_bytes(s, "scale_inv")?)
            }
            (ScaleParts::BlockF32(s), QuantFormat::Fp8Block { .. }) => StorageScales::BlockF32 {
                shape: s.dims(),
                bytes: f32_bytes(s, "block scales")?,
            },
            (
                ScaleParts::BlockBytes { bytes, layout },
                QuantFormat::Mxfp8 { .. } | QuantFormat::Nvfp4 { .. },
            ) => {
                let shape = bytes.dims();
                StorageScales::BlockBytes {
                    shape,
                    bytes: B::u8_into_bytes(bytes.into_primitive(), "scale bytes")?,
                    layout,
                }
            }
            (ScaleParts::TensorScaleInv(_), _) => return Err(expect_scales("TensorScaleInv")),
            (ScaleParts::BlockF32(_), _) => return Err(expect_scales("BlockF32")),
            (ScaleParts::BlockBytes { .. }, _) => return Err(expect_scales("BlockBytes")),
        };
        let amax = self.amax.map(|a| f32_bytes(a, "amax")).transpose()?;
        Ok(QuantizedStorage {
            format: self.format,
            codes: B::u8_into_bytes(self.codes.into_primitive(), "codes")?,
            codes_shape,
            scales,
            amax,
            shared_scale: self.shared_scale,
        })
    }

    /// The parts on `device` (Burn's `to_device` of each tensor).
    pub fn to_device(self, device: &B::Device) -> Self {
        QuantizedParts {
            codes: self.codes.to_device(device),
            scales: match self.scales {
                ScaleParts::TensorScaleInv(s) => ScaleParts::TensorScaleInv(s.to_device(device)),
                ScaleParts::BlockF32(s) => ScaleParts::BlockF32(s.to_device(device)),
                ScaleParts::BlockBytes { bytes, layout } => ScaleParts::BlockBytes {
                    bytes: bytes.to_device(device),
                    layout,
                },
            },
            amax: self.amax.map(|a| a.to_device(device)),
            ..self
        }
    }

    /// The device the codes live on.
    pub fn device(&self) -> B::Device {
        self.codes.device()
    }
}

/// A quantized tensor as Burn tensors: each held direction's storage as `QuantizedParts` (in its
/// own format: the two directions of a hybrid tensor differ).
#[derive(Debug, Clone)]
pub struct QuantizedTensorParts<B: LowpBackend> {
    pub rows: usize,
    pub cols: usize,
    pub rowwise: Option<QuantizedParts<B>>,
    pub columnwise: Option<QuantizedParts<B>>,
}

impl<B: LowpBackend> QuantizedTensorParts<B> {
    /// Every held storage as Burn tensors. An identity (high-precision) storage is an error: it is
    /// a Burn float tensor already.
    pub fn from_tensor(tensor: &QuantizedTensor<B>) -> Result<Self> {
        let side = |direction| -> Result<Option<QuantizedParts<B>>> {
            match tensor.storage(direction) {
                None => Ok(None),
                Some(_) => Ok(Some(QuantizedParts::from_storage(
                    tensor.quantized(direction)?,
                ))),
            }
        };
        Ok(QuantizedTensorParts {
            rows: tensor.rows,
            cols: tensor.cols,
            rowwise: side(Direction::Rowwise)?,
            columnwise: side(Direction::Columnwise)?,
        })
    }

    /// The quantized tensor back (see [`QuantizedParts::into_storage`]); each side's codes and
    /// block scales must have the shapes its format gives the `[rows, cols]` matrix.
    pub fn into_tensor(self) -> Result<QuantizedTensor<B>> {
        let (rows, cols) = (self.rows, self.cols);
        let side =
            |p: Option<QuantizedParts<B>>, direction: Direction| -> Result<Option<Storage<B>>> {
                let Some(p) = p else { return Ok(None) };
                let what = |t: &str| format!("{} {t}", direction.name());
                check_dims(
                    what("codes"),
                    &p.codes.dims(),
                    &codes_shape(&p.format, rows, cols, direction),
                )?;
                let scales = match &p.scales {
                    ScaleParts::TensorScaleInv(_) => None,
                    ScaleParts::BlockF32(s) => Some(s.dims()),
                    ScaleParts::BlockBytes { bytes, .. } => Some(bytes.dims()),
                };
                if let Some(have) = scales {
                    check_dims(
                        what("scales"),
                        &have,
                        &scales_shape(&p.format, rows, cols, direction),
                    )?;
                }
                p.into_storage().map(|s| Some(Storage::Quantized(s)))
            };
        Ok(QuantizedTensor {
            rows,
            cols,
            rowwise: side(self.rowwise, Direction::Rowwise)?,
            columnwise: side(self.columnwise, Direction::Columnwise)?,
        })
    }

    /// The parts on `device`.
    pub fn to_device(self, device: &B::Device) -> Self {
        QuantizedTensorParts {
            rowwise: self.rowwise.map(|p| p.to_device(device)),
            columnwise: self.columnwise.map(|p| p.to_device(device)),
            ..self
        }
    }
}

// --- Burn records ---

/// The saved form of [`ScaleParts`]: f32 scales as f32 `TensorData`, scale bytes as `U8`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum ScalePartsItem {
    TensorScaleInv(TensorData),
    BlockF32(TensorData),
    BlockBytes {
        bytes: TensorData,
        layout: ScaleLayout,
    },
}

/// The saved form of [`QuantizedParts`] (the record item Burn's recorders write). The codes and
/// byte scales are kept `U8` and the f32 tensors f32 whatever the precision settings say: their
/// bytes are the quantization, and any conversion would change them.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct QuantizedPartsItem {
    pub format: QuantFormat,
    pub codes: TensorData,
    pub scales: ScalePartsItem,
    pub amax: Option<TensorData>,
    pub shared_scale: bool,
}

/// The saved form of [`QuantizedTensorParts`].
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct QuantizedTensorPartsItem {
    pub rows: usize,
    pub cols: usize,
    pub rowwise: Option<QuantizedPartsItem>,
    pub columnwise: Option<QuantizedPartsItem>,
}

fn u8_from_data<B: LowpBackend>(data: TensorData, device: &B::Device) -> Tensor<B, 2, Int> {
    Tensor::from_data(data, (device, DType::U8))
}

impl<B: LowpBackend> Record<B> for QuantizedParts<B> {
    type Item<S: PrecisionSettings> = QuantizedPartsItem;

    fn into_item<S: PrecisionSettings>(self) -> QuantizedPartsItem {
        QuantizedPartsItem {
            format: self.format,
            codes: self.codes.into_data(),
            scales: match self.scales {
                ScaleParts::TensorScaleInv(s) => ScalePartsItem::TensorScaleInv(s.into_data()),
                ScaleParts::BlockF32(s) => ScalePartsItem::BlockF32(s.into_data()),
                ScaleParts::BlockBytes { bytes, layout } => ScalePartsItem::BlockBytes {
                    bytes: bytes.into_data(),
                    layout,
                },
            },
            amax: self.amax.map(|a| a.into_data()),
            shared_scale: self.shared_scale,
        }
    }

    fn from_item<S: PrecisionSettings>(item: QuantizedPartsItem, device: &B::Device) -> Self {
        // f32 stays f32 (`(device, DType::F32)`), whatever the backend's default float dtype.
        let f32_tensor = |d: TensorData| (d, (device, DType::F32));
        QuantizedParts {
            format: item.format,
            codes: u8_from_data(item.codes, device),
            scales: match item.scales {
                ScalePartsItem::TensorScaleInv(s) => {
                    let (d, o) = f32_tensor(s);
                    ScaleParts::TensorScaleInv(Tensor::from_data(d, o))
                }
                ScalePartsItem::BlockF32(s) => {
                    let (d, o) = f32_tensor(s);
                    ScaleParts::BlockF32(Tensor::from_data(d, o))
                }
                ScalePartsItem::BlockBytes { bytes, layout } => ScaleParts::BlockBytes {
                    bytes: u8_from_data(bytes, device),
                    layout,
                },
            },
            amax: item
                .amax
                .map(|a| Tensor::from_data(a, (device, DType::F32))),
            shared_scale: item.shared_scale,
        }
    }
}

impl<B: LowpBackend> Record<B> for QuantizedTensorParts<B> {
    type Item<S: PrecisionSettings> = QuantizedTensorPartsItem;

    fn into_item<S: PrecisionSettings>(self) -> QuantizedTensorPartsItem {
        QuantizedTensorPartsItem {
            rows: self.rows,
            cols: self.cols,
            rowwise: self.rowwise.map(|p| p.into_item::<S>()),
            columnwise: self.columnwise.map(|p| p.into_item::<S>()),
        }
    }

    fn from_item<S: PrecisionSettings>(item: QuantizedTensorPartsItem, device: &B::Device) -> Self {
        QuantizedTensorParts {
            rows: item.rows,
            cols: item.cols,
            rowwise: item
                .rowwise
                .map(|p| QuantizedParts::from_item::<S>(p, device)),
            columnwise: item
                .columnwise
                .map(|p| QuantizedParts::from_item::<S>(p, device)),
        }
    }
}
