//! `LowpBackend` for `NdArray`: the reference quantizers on the host. NdArray tensors are f32, so
//! inputs are quantized as f32 (an RHT copy is therefore kept in f32, not rounded to bf16).

use std::sync::Arc;

use burn::backend::ndarray::{NdArray, NdArrayTensor};
use burn::tensor::ops::{FloatTensor, FloatTensorOps};
use burn::tensor::{read_sync, TensorData, TensorMetadata};

use super::grouped::{host_group_layout, GroupLayout, Groups, RowGroup};
use super::{matrix_dims, LowpBackend};
use crate::error::{LowpError, Result};
use crate::format::grouped::{
    group_config, group_ranges, group_slice, group_values, quantize_groups, GroupScaling,
};
use crate::format::scaling::amax;
use crate::format::{
    check_shape, codes_shape, quantize, quantize_fp8_with_scale, scales_shape, Direction,
    FormatConfig, Fp8Format, HostMatrix, HostQuantized, InputDtype, QuantFormat, Scales, Usage,
};
use crate::backend::quantized::{QuantizedStorage, QuantizedTensor, Storage, StorageScales};

/// Host bytes shared between clones.
pub type HostBytes = Arc<Vec<u8>>;

fn to_matrix(x: FloatTensor<NdArray>, name: &str) -> Result<HostMatrix> {
    let (rows, cols) = matrix_dims(&x.shape().as_slice());
    let data = read_sync(NdArray::<f32>::float_into_data(x))
        .map_err(|e| LowpError::invalid("tensor", name, format!("could not be read: {e:?}")))?;
    let values = data
        .convert::<f32>()
        .into_vec::<f32>()
        .map_err(|e| LowpError::invalid("tensor", name, format!("is not f32: {e:?}")))?;
    HostMatrix::new(name, rows, cols, InputDtype::F32, values)
}

fn upload(bytes: Vec<u8>) -> HostBytes {
    Arc::new(bytes)
}

/// Swizzles (or unswizzles) the scales of each quantized storage on its own, so that the two
/// directions of a hybrid tensor are handled each in its format.
fn relayout(
    mut q: QuantizedTensor<NdArray>,
    to_swizzled: bool,
) -> Result<QuantizedTensor<NdArray>> {
    for (storage, direction) in [
        (q.rowwise.as_mut(), Direction::Rowwise),
        (q.columnwise.as_mut(), Direction::Columnwise),
    ] {
        let Some(Storage::Quantized(s)) = storage else {
            continue;
        };
        let mut host = s.to_host_tensor(q.rows, q.cols, direction);
        if to_swizzled {
            host.swizzle_scales()?;
        } else {
            host.unswizzle_scales()?;
        }
        let relaid = host.data(direction).expect("kept the direction");
        *s = QuantizedStorage::from_host(s.format, relaid, &upload);
    }
    Ok(q)
}

/// The `count` scales a delayed cast reads (`ScaleColumns`), on the host.
fn scale_values(scales: crate::backend::ScaleColumns<NdArray>, count: usize) -> Result<Vec<f32>> {
    let indices = scales.indices(count)?;
    let values = to_matrix(scales.scales, "scales")?.values;
    Ok(indices.into_iter().map(|i| values[i]).collect())
}

fn f32_bytes(values: impl IntoIterator<Item = f32>) -> Vec<u8> {
    values.into_iter().flat_map(f32::to_le_bytes).collect()
}

/// FP8 per-tensor codes of each group of `m` with its given scale (`scales[g]`), each group's
/// amax recorded.
fn fp8_groups_with_scales(
    m: &HostMatrix,
    fp8: Fp8Format,
    scales: &[f32],
    groups: &[RowGroup],
    usage: Usage,
) -> Result<QuantizedTensor<NdArray>> {
    let parts = groups
        .iter()
        .zip(scales)
        .map(|(group, &scale)| {
            if group.len == 0 {
                return Ok(None);
            }
            quantize_fp8_with_scale(&group_slice(m, *group)?, fp8, scale, usage).map(Some)
        })
        .collect::<Result<Vec<_>>>()?;
    let format = QuantFormat::Fp8Tensor { fp8 };
    Ok(assemble_grouped(&parts, groups, format, (m.rows, m.cols), usage, |g| 1.0 / scales[g]))
}

/// Lays per-group reference results out as one grouped tensor (`format::grouped`): codes and block
/// scales at each group's byte ranges (zeros elsewhere), per-tensor values in per-group arrays.
/// `empty_scale_inv` is the `scale_inv` an empty group gets (the scale rule's value for amax 0, or
/// the given delayed scale), as the kernels write it.
fn assemble_grouped(
    parts: &[Option<HostQuantized>],
    groups: &[RowGroup],
    format: QuantFormat,
    (rows, cols): (usize, usize),
    usage: Usage,
    empty_scale_inv: impl Fn(usize) -> f32,
) -> QuantizedTensor<NdArray> {
    let side = |direction: Direction| {
        let codes_len = {
            let [r, c] = codes_shape(&format, rows, cols, direction);
            r * c
        };
        let [sr, sc] = scales_shape(&format, rows, cols, direction);
        let mut codes = vec![0u8; codes_len];
        let mut block_scales = vec![0u8; sr * sc * if matches!(format, QuantFormat::Fp8Block { .. }) { 4 } else { 1 }];
        let mut scale_inv = Vec::new();
        let mut amax = Vec::new();
        for (g, group) in groups.iter().enumerate() {
            let ranges = group_ranges(&format, direction, cols, *group);
            let Some(data) = parts[g].as_ref().and_then(|p| p.data(direction)) else {
                scale_inv.push(empty_scale_inv(g));
                amax.push(0.0);
                continue;
            };
            codes[ranges.codes.clone()].copy_from_slice(&data.codes);
            match &data.scales {
                Scales::TensorScaleInv(v) => scale_inv.push(*v),
                Scales::BlockF32 { values, .. } => {
                    block_scales[ranges.scales.clone()].copy_from_slice(&f32_bytes(values.iter().copied()))
                }
                Scales::BlockBytes { bytes, .. } => {
                    block_scales[ranges.scales.clone()].copy_from_slice(bytes)
                }
            }
            amax.push(data.amax.unwrap_or(0.0));
        }
        let scales = match format {
            QuantFormat::Fp8Tensor { .. } => StorageScales::TensorScaleInv(upload(f32_bytes(scale_inv))),
            QuantFormat::Fp8Block { .. } => StorageScales::BlockF32 {
                shape: [sr, sc],
                bytes: upload(block_scales),
            },
            QuantFormat::Mxfp8 { .. } | QuantFormat::Nvfp4 { .. } => StorageScales::BlockBytes {
                shape: [sr, sc],
                bytes: upload(block_scales),
                layout: crate::format::ScaleLayout::Compact,
            },
        };
        let has_amax = matches!(format, QuantFormat::Fp8Tensor { .. } | QuantFormat::Nvfp4 { .. });
        Storage::Quantized(QuantizedStorage {
            format,
            codes: upload(codes),
            codes_shape: codes_shape(&format, rows, cols, direction),
            scales,
            amax: has_amax.then(|| upload(f32_bytes(amax))),
            shared_scale: false,
        })
    };
    QuantizedTensor {
        rows,
        cols,
        rowwise: usage.rowwise.then(|| side(Direction::Rowwise)),
        columnwise: usage.columnwise.then(|| side(Direction::Columnwise)),
    }
}

fn host_groups(groups: &Groups<NdArray>) -> Result<Vec<RowGroup>> {
    Ok(groups.host.get()?.groups)
}

impl LowpBackend for NdArray {
    type Bytes = HostBytes;

    fn lowp_quantize(
        x: FloatTensor<Self>,
        config: &FormatConfig,
        usage: Usage,
        optimize_for_gemm: bool,
    ) -> Result<QuantizedTensor<Self>> {
        let m = to_matrix(x, "input")?;
        check_shape(&m.name, m.rows, m.cols, &config.format())?;
        let mut host = quantize(&m, config, usage)?;
        if optimize_for_gemm && matches!(config, FormatConfig::Mxfp8(_) | FormatConfig::Nvfp4(_)) {
            host.swizzle_scales()?;
        }
        Ok(QuantizedTensor::from_host(&host, upload))
    }

    fn quantize_fp8_with_scale(
        x: FloatTensor<Self>,
        fp8: Fp8Format,
        scale: crate::backend::ScaleColumns<Self>,
        usage: Usage,
        _record: Option<crate::backend::AmaxHistoryColumns<Self>>,
    ) -> Result<QuantizedTensor<Self>> {
        let m = to_matrix(x, "input")?;
        check_shape(
            &m.name,
            m.rows,
            m.cols,
            &crate::format::QuantFormat::Fp8Tensor { fp8 },
        )?;
        let scale = scale_values(scale, 1)?[0];
        let host = quantize_fp8_with_scale(&m, fp8, scale, usage)?;
        Ok(QuantizedTensor::from_host(&host, upload))
    }

    fn lowp_dequantize(
        q: &QuantizedTensor<Self>,
        direction: Direction,
    ) -> Result<FloatTensor<Self>> {
        let storage = match q.require(direction)? {
            Storage::Quantized(storage) => storage,
            Storage::HighPrecision(t) => return Ok(t.clone()),
        };
        let values = storage
            .to_host_tensor(q.rows, q.cols, direction)
            .dequantize(direction)?;
        Ok(NdArrayTensor::from_data(TensorData::new(
            values,
            [q.rows, q.cols],
        )))
    }

    fn swizzle_scales(q: QuantizedTensor<Self>) -> Result<QuantizedTensor<Self>> {
        relayout(q, true)
    }

    fn unswizzle_scales(q: QuantizedTensor<Self>) -> Result<QuantizedTensor<Self>> {
        relayout(q, false)
    }

    fn bytes_to_host(bytes: &Self::Bytes) -> Vec<u8> {
        bytes.as_ref().clone()
    }

    fn bytes_from_host(bytes: Vec<u8>, _device: &Self::Device) -> Self::Bytes {
        upload(bytes)
    }

    fn bytes_device(_bytes: &Self::Bytes) -> Self::Device {
        Default::default()
    }

    fn bytes_slice(bytes: &Self::Bytes, range: std::ops::Range<usize>) -> Self::Bytes {
        upload(bytes[range].to_vec())
    }

    /// The splits are read on the host: NdArray has no device to keep them on.
    fn group_layout(
        m_splits: burn::tensor::ops::IntTensor<Self>,
        tokens: usize,
    ) -> Result<GroupLayout<Self>> {
        let shape = m_splits.shape();
        if shape.num_dims() != 1 || shape.as_slice()[0] == 0 {
            return Err(LowpError::shape(
                "m_splits",
                format!("shape {:?}", shape.as_slice()),
                "one split size per group, at least one group",
            ));
        }
        let data = burn::tensor::Tensor::<NdArray, 1, burn::tensor::Int>::from_primitive(m_splits)
            .into_data();
        let splits: Vec<i32> = data
            .convert::<i64>()
            .into_vec::<i64>()
            .map_err(|e| LowpError::invalid("m_splits", "values", format!("{e:?}")))?
            .into_iter()
            .map(|v| v.clamp(i32::MIN as i64, i32::MAX as i64) as i32)
            .collect();
        Ok(host_group_layout::<Self>(&splits, tokens, &Default::default()))
    }

    fn lowp_quantize_grouped(
        x: FloatTensor<Self>,
        groups: &Groups<Self>,
        config: &FormatConfig,
        usage: Usage,
        scaling: GroupScaling,
    ) -> Result<QuantizedTensor<Self>> {
        let m = to_matrix(x, "input")?;
        check_shape(&m.name, m.rows, m.cols, &config.format())?;
        let groups = host_groups(groups)?;
        if let (GroupScaling::Shared, FormatConfig::Fp8Current(c)) = (scaling, config) {
            // The scale of the largest group amax, for every group.
            crate::format::grouped::check_groups(&m.name, &groups, m.rows)?;
            let amaxes: Vec<f32> = groups.iter().map(|g| amax(group_values(&m, *g))).collect();
            let scale = c.scale_for(GroupScaling::shared_amax(&amaxes));
            let q = fp8_groups_with_scales(&m, c.fp8, &vec![scale; groups.len()], &groups, usage)?;
            return Ok(q.with_shared_scale());
        }
        let parts = quantize_groups(&m, &groups, config, usage)?;
        // An empty group's scale: the rule's for amax 0 (an empty slice's scale).
        let empty = |g: usize| match group_config(config, g) {
            FormatConfig::Fp8Current(c) => 1.0 / c.scale_for(0.0),
            _ => 1.0,
        };
        Ok(assemble_grouped(&parts, &groups, config.format(), (m.rows, m.cols), usage, empty))
    }

    fn quantize_fp8_with_scale_grouped(
        x: FloatTensor<Self>,
        fp8: Fp8Format,
        scales: crate::backend::ScaleColumns<Self>,
        groups: &Groups<Self>,
        usage: Usage,
        scaling: GroupScaling,
        _record: Option<crate::backend::AmaxHistoryColumns<Self>>,
    ) -> Result<QuantizedTensor<Self>> {
        let m = to_matrix(x, "input")?;
        check_shape(&m.name, m.rows, m.cols, &QuantFormat::Fp8Tensor { fp8 })?;
        let groups = host_groups(groups)?;
        let mut scales = scale_values(scales, groups.len())?;
        crate::format::grouped::check_groups(&m.name, &groups, m.rows)?;
        if scaling == GroupScaling::Shared {
            let shared = GroupScaling::shared_delayed_scale(&scales);
            scales.fill(shared);
            return Ok(fp8_groups_with_scales(&m, fp8, &scales, &groups, usage)?.with_shared_scale());
        }
        fp8_groups_with_scales(&m, fp8, &scales, &groups, usage)
    }

    fn float_from_bytes(bytes: &Self::Bytes, shape: [usize; 2]) -> FloatTensor<Self> {
        let values: Vec<f32> = bytes
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        NdArrayTensor::from_data(TensorData::new(values, shape))
    }

    /// Dequantize + f32 matmul. NdArray holds f32 only, so a BF16/F16 output is the f32 result
    /// rounded to that precision (what a GPU writing BF16 stores), kept as f32.
    fn lowp_gemm(
        kind: super::GemmKind,
        a: &QuantizedTensor<Self>,
        b: &QuantizedTensor<Self>,
        options: super::GemmOptions<Self>,
    ) -> Result<FloatTensor<Self>> {
        use burn::tensor::FloatDType;
        let wanted = options.out_dtype;
        let out = super::gemm::dequantize_matmul(
            kind,
            a,
            b,
            FloatDType::F32,
            super::GemmOptions {
                out_dtype: FloatDType::F32,
                accumulate: options.accumulate,
                split_accumulator: options.split_accumulator,
                // Added in f32, before the one rounding below (as cuBLASLt's epilogue does).
                bias: options.bias,
            },
        )?;
        let dtype = match wanted {
            FloatDType::BF16 => InputDtype::BF16,
            FloatDType::F16 => InputDtype::F16,
            _ => return Ok(out),
        };
        let m = to_matrix(out, "GEMM output")?;
        let rounded = m.values.iter().map(|&v| dtype.round(v)).collect();
        Ok(NdArrayTensor::from_data(TensorData::new(
            rounded,
            [m.rows, m.cols],
        )))
    }

    fn float_from_host(m: &HostMatrix, _device: &Self::Device) -> FloatTensor<Self> {
        NdArrayTensor::from_data(TensorData::new(m.values.clone(), [m.rows, m.cols]))
    }
}
