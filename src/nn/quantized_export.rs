//! Exporting a trained module's weights, quantized, as plain `burn::nn::Linear` records: the
//! weight a Burn native quantized (`QFloat`) tensor, the bias f32. A plain Burn inference program
//! loads the saved record the usual way and runs it; Burn's `Linear::forward` dequantizes the
//! weight and multiplies in float:
//!
//! ```text
//! let export = lowp_linear.export_quantized()?;                     // burn-lowp side
//! let recorder = NamedMpkFileRecorder::<FullPrecisionSettings>::new();
//! Recorder::<B>::record(&recorder, export.record, path)?;          // host data: any backend B
//! export.config.save(config_path)?;
//!
//! let record = NamedMpkFileRecorder::<FullPrecisionSettings>::new().load(path, &device)?; // plain Burn
//! let linear = LinearConfig::load(config_path)?.init::<B>(&device).load_record(record);
//! ```
//!
//! The weight is quantized on the host by the reference quantizers (bit-exact with the device
//! casts) under the module's own forward weight quantizer. burn-nn holds a linear weight as
//! `[in, out]` and Burn's dequantize takes blocks along the last dimension only (see
//! `backend::quantized::burn_native`), so the exported tensor is the weight's *columnwise*
//! quantization, the `[in, out]` matrix with blocks along `out`:
//!
//! | weight quantizer | exported | same values as the forward GEMM's weight? |
//! |---|---|---|
//! | FP8 per-tensor (current scaling) | columnwise codes `[in, out]`, the one scale | yes (the transpose) |
//! | FP8 block 128x128 | columnwise codes and tile scales | yes (the transpose) |
//! | FP8 block 1x128 | columnwise: blocks of 128 output features | no: the forward's blocks run along `in` |
//! | MXFP8 2D (32x32 tiles) | columnwise, transposed to `[in, out]` with 1x32 blocks | yes |
//! | MXFP8 1D | columnwise, transposed to `[in, out]` with 1x32 blocks | no: the forward's blocks run along `in` |
//!
//! Where the values differ, both are the weight quantized under the same recipe (the columnwise
//! copy is the one the dgrad GEMM reads); Burn cannot express blocks one element wide (`128x1`,
//! `32x1`) along its last dimension. NVFP4, hybrid, identity and delayed-scaling weight quantizers
//! are errors: Burn 0.21 has no NVFP4 form, and a delayed scale is training state.
//!
//! The record ([`LinearRecordData`]) holds host `TensorData` and serializes exactly as
//! `burn::nn::LinearRecord` does (`weight` and `bias` parameters, each an id and a tensor), so it
//! saves from any backend, even one that cannot hold FP8 tensors (NdArray, wgpu): only the backend
//! that loads it as a `burn::nn::Linear` must (CUDA in Burn 0.21).

use burn::module::{Param, ParamId};
use burn::record::{PrecisionSettings, Record};
use burn::tensor::backend::{Backend, DTypeUsage};
use burn::tensor::{DType, Tensor, TensorData};
use serde::{Deserialize, Serialize};

use super::layernorm_linear::LayerNormLinear;
use super::layernorm_mlp::LayerNormMlp;
use super::linear::Linear;
use super::lowp_state::LowpState;
use crate::backend::quantized::burn_native::{from_burn_data, to_burn_data};
use crate::error::{LowpError, Result};
use crate::format::matrix::transpose;
use crate::format::mxfp8::{round_up, MXFP8_BLOCK};
use crate::format::{
    quantize, Direction, HostMatrix, HostQuantized, InputDtype, QuantFormat, QuantizedData,
    ScaleLayout, Scales, Usage,
};
use crate::quant::QuantizerSpec;

/// One saved parameter, as Burn writes it (`ParamSerde`: an id and the tensor's data).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ParamItem {
    pub id: String,
    pub param: TensorData,
}

/// The saved form of [`LinearRecordData`]: field for field what `burn::nn::LinearRecord` saves.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LinearRecordItem {
    pub weight: ParamItem,
    pub bias: Option<ParamItem>,
}

/// A `burn::nn::Linear` record held as host data: `weight` `[in, out]` (quantized or float),
/// `bias` `[out]` f32. It saves and loads through Burn's recorders on any backend, and files it
/// writes load as `burn::nn::LinearRecord` (and the other way round).
#[derive(Debug, Clone)]
pub struct LinearRecordData {
    pub weight: TensorData,
    pub bias: Option<TensorData>,
    pub weight_id: String,
    pub bias_id: String,
}

/// Float data in the settings' precision (as Burn saves float tensors); quantized data as is.
fn saved<E: burn::tensor::Element>(data: TensorData) -> TensorData {
    match data.dtype {
        DType::QFloat(_) => data,
        _ => data.convert::<E>(),
    }
}

impl<B: Backend> Record<B> for LinearRecordData {
    type Item<S: PrecisionSettings> = LinearRecordItem;

    fn into_item<S: PrecisionSettings>(self) -> LinearRecordItem {
        LinearRecordItem {
            weight: ParamItem {
                id: self.weight_id,
                param: saved::<S::FloatElem>(self.weight),
            },
            bias: self.bias.map(|b| ParamItem {
                id: self.bias_id,
                param: saved::<S::FloatElem>(b),
            }),
        }
    }

    fn from_item<S: PrecisionSettings>(item: LinearRecordItem, _device: &B::Device) -> Self {
        LinearRecordData {
            weight: saved::<f32>(item.weight.param),
            bias_id: item
                .bias
                .as_ref()
                .map(|b| b.id.clone())
                .unwrap_or_else(|| ParamId::new().serialize()),
            bias: item.bias.map(|b| saved::<f32>(b.param)),
            weight_id: item.weight.id,
        }
    }
}

impl LinearRecordData {
    /// The record as `burn::nn::LinearRecord` on `device`, for `Linear::load_record` in this
    /// process; an error where the backend cannot store the weight's dtype (Burn 0.21's NdArray and
    /// wgpu hold no FP8 quantized tensors).
    pub fn into_burn_record<B: Backend>(
        self,
        device: &B::Device,
    ) -> Result<burn::nn::LinearRecord<B>> {
        if !B::dtype_usage(device, self.weight.dtype).contains(DTypeUsage::Storage) {
            return Err(LowpError::invalid(
                "linear weight",
                format!("{:?} on {}", self.weight.dtype, B::name(device)),
                "this backend cannot store the weight's dtype (Burn 0.21 stores FP8 quantized tensors on CUDA)",
            ));
        }
        let id = |id: &str| {
            ParamId::try_deserialize(id)
                .ok_or_else(|| LowpError::invalid("parameter id", id, "is not a Burn ParamId"))
        };
        let bias = match self.bias {
            Some(b) => Some(Param::initialized(
                id(&self.bias_id)?,
                Tensor::<B, 1>::from_data(b, device),
            )),
            None => None,
        };
        Ok(burn::nn::LinearRecord {
            weight: Param::initialized(
                id(&self.weight_id)?,
                Tensor::<B, 2>::from_data(self.weight, device),
            ),
            bias,
        })
    }
}

/// A module's linear layer, exported: the plain Burn config to build it with and its record.
#[derive(Debug, Clone)]
pub struct QuantizedLinearExport {
    /// `burn::nn::LinearConfig::new(in, out)` with the module's bias, Row layout (`[in, out]`).
    pub config: burn::nn::LinearConfig,
    pub record: LinearRecordData,
    /// The format of the exported weight.
    pub format: QuantFormat,
}

impl QuantizedLinearExport {
    /// The exported weight dequantized by burn-lowp's reference (code times its block's scale,
    /// what Burn's dequantize computes): f32 `[in, out]`.
    pub fn dequantized_weight(&self) -> Result<TensorData> {
        let (format, data) = from_burn_data(&self.record.weight)?;
        let [rows, cols] = data.codes_shape;
        let host = HostQuantized {
            format,
            rows,
            cols,
            rowwise: Some(data),
            columnwise: None,
        };
        Ok(TensorData::new(
            host.dequantize(Direction::Rowwise)?,
            [rows, cols],
        ))
    }
}

/// The `[out, in]` MXFP8 columnwise storage (32x1 blocks) as the rowwise storage of the `[in, out]`
/// transpose (1x32 blocks): the same codes and scales, moved.
/// The columnwise storage the quantizer was asked for (`Usage::BOTH`).
fn columnwise(q: &HostQuantized) -> Result<&QuantizedData> {
    q.data(Direction::Columnwise).ok_or_else(|| {
        LowpError::invalid(
            "weight quantization",
            q.format.name(),
            "holds no columnwise storage",
        )
    })
}

fn mxfp8_columnwise_transposed(q: &HostQuantized) -> Result<QuantizedData> {
    let col = columnwise(q)?;
    let (out_f, in_f) = (q.rows, q.cols);
    let Scales::BlockBytes {
        shape,
        bytes,
        layout,
    } = &col.scales
    else {
        return Err(LowpError::invalid(
            "MXFP8 scales",
            q.format.name(),
            "must be E8M0 scale bytes",
        ));
    };
    if *layout != ScaleLayout::Compact {
        return Err(LowpError::invalid(
            "MXFP8 scales",
            "swizzled",
            "export reads the compact layout",
        ));
    }
    let blocks = out_f / MXFP8_BLOCK;
    // Columnwise scales: [roundup(out / 32, 4), roundup(in, 128)], entry [b, k] for rows
    // 32b..32b+31 of column k. Transposed rowwise: [roundup(in, 128), roundup(out / 32, 4)].
    let padded = [round_up(in_f, 128), round_up(blocks, 4)];
    let mut scales = vec![0u8; padded[0] * padded[1]];
    for b in 0..blocks {
        for k in 0..in_f {
            scales[k * padded[1] + b] = bytes[b * shape[1] + k];
        }
    }
    Ok(QuantizedData {
        codes: transpose(&col.codes, out_f, in_f),
        codes_shape: [in_f, out_f],
        scales: Scales::BlockBytes {
            shape: padded,
            bytes: scales,
            layout: ScaleLayout::Compact,
        },
        amax: None,
    })
}

/// Exports an `[out, in]` weight (and `[out]` bias) quantized by `spec` as a plain Burn linear
/// (see the module docs for which quantization each format exports). `name` names the weight in
/// errors.
pub fn export_linear<B: Backend>(
    name: &str,
    weight: Tensor<B, 2>,
    bias: Option<Tensor<B, 1>>,
    spec: &QuantizerSpec,
) -> Result<QuantizedLinearExport> {
    let config =
        match spec {
            QuantizerSpec::Fp8Current { .. }
            | QuantizerSpec::Fp8Block { .. }
            | QuantizerSpec::Mxfp8 { .. } => spec.format_config(None)?,
            other => return Err(LowpError::invalid(
                format!("{name} weight quantizer"),
                other.name(),
                "export to Burn's quantized tensors takes FP8 current scaling, FP8 block scaling \
                 or MXFP8 (Burn 0.21 has no NVFP4 form; a delayed scale is training state)",
            )),
        };
    let [out_f, in_f] = weight.dims();
    let values = weight
        .into_data()
        .convert::<f32>()
        .into_vec::<f32>()
        .map_err(|e| {
            LowpError::invalid(
                format!("{name} weight"),
                format!("{e:?}"),
                "a float tensor readable as f32",
            )
        })?;
    let matrix = HostMatrix::new(
        format!("{name} weight"),
        out_f,
        in_f,
        InputDtype::F32,
        values,
    )?;
    let q = quantize(&matrix, &config, Usage::BOTH)?;
    let data = match q.format {
        QuantFormat::Mxfp8 { fp8, .. } => to_burn_data(
            QuantFormat::Mxfp8 {
                fp8,
                block_2d: false,
            },
            Direction::Rowwise,
            &mxfp8_columnwise_transposed(&q)?,
        )?,
        format => to_burn_data(format, Direction::Columnwise, columnwise(&q)?)?,
    };
    let bias = bias
        .map(|b| {
            let dims = b.dims();
            if dims != [out_f] {
                return Err(LowpError::shape(
                    format!("{name} bias"),
                    format!("{dims:?}"),
                    format!("the weight needs [{out_f}]"),
                ));
            }
            Ok(b.into_data().convert::<f32>())
        })
        .transpose()?;
    Ok(QuantizedLinearExport {
        config: burn::nn::LinearConfig::new(in_f, out_f).with_bias(bias.is_some()),
        record: LinearRecordData {
            weight: data,
            bias,
            weight_id: ParamId::new().serialize(),
            bias_id: ParamId::new().serialize(),
        },
        format: q.format,
    })
}

/// GEMM `gemm` of a module (`part` names it after the module: `""`, `" fc1"`), exported under the
/// module's forward weight quantizer of that GEMM.
fn export_gemm<B: Backend>(
    lowp: &LowpState<B>,
    gemm: usize,
    part: &str,
    weight: &Param<Tensor<B, 2>>,
    bias: Option<&Param<Tensor<B, 1>>>,
) -> Result<QuantizedLinearExport> {
    let slot = lowp.layout.gemms()[gemm].weight;
    export_linear(
        &format!("{}{part}", lowp.layout.name),
        weight.val(),
        bias.map(|b| b.val()),
        &lowp.quantizers.forward[slot].spec,
    )
}

impl<B: Backend> Linear<B> {
    /// The weights as a plain Burn `Linear`, the weight quantized by this module's forward weight
    /// quantizer as a Burn `QFloat` tensor.
    pub fn export_quantized(&self) -> Result<QuantizedLinearExport> {
        export_gemm(&self.lowp, 0, "", &self.weight, self.bias.as_ref())
    }
}

impl<B: Backend> LayerNormLinear<B> {
    /// The linear part as a plain Burn `Linear` with a quantized weight (the norm exports as a
    /// float burn-nn module through `to_burn`).
    pub fn export_quantized(&self) -> Result<QuantizedLinearExport> {
        export_gemm(&self.lowp, 0, "", &self.weight, self.bias.as_ref())
    }
}

impl<B: Backend> LayerNormMlp<B> {
    /// `fc1` and `fc2` as plain Burn `Linear`s with quantized weights (the norm exports as a
    /// float burn-nn module through `to_burn`).
    pub fn export_quantized(&self) -> Result<(QuantizedLinearExport, QuantizedLinearExport)> {
        Ok((
            export_gemm(
                &self.lowp,
                0,
                " fc1",
                &self.fc1_weight,
                self.fc1_bias.as_ref(),
            )?,
            export_gemm(
                &self.lowp,
                1,
                " fc2",
                &self.fc2_weight,
                self.fc2_bias.as_ref(),
            )?,
        ))
    }
}
