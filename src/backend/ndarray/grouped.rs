//! `GroupedOps` on `NdArray`: the grouped layout from splits read on the host (NdArray has no
//! device to keep them on) and the grouped quantizers of `format::grouped`, each group through
//! the reference quantizers and laid out as the device kernels lay it out (`assemble_grouped`).
//! The grouped GEMM and the other grouped ops run the traits' defaults.

use burn::backend::ndarray::NdArray;
use burn::tensor::ops::FloatTensor;
use burn::tensor::TensorMetadata;

use super::{scale_values, to_matrix, upload};
use crate::backend::grouped::host_group_layout;
use crate::backend::{
    AmaxHistoryColumns, GroupLayout, GroupedOps, Groups, QuantizedStorage, QuantizedTensor,
    RowGroup, ScaleColumns, Storage, StorageScales,
};
use crate::error::{LowpError, Result};
use crate::format::grouped::{group_config, group_ranges, group_slice, group_values, quantize_groups, GroupScaling};
use crate::format::scaling::amax;
use crate::format::{
    check_shape, codes_shape, quantize_fp8_with_scale, scales_shape, Direction, FormatConfig,
    Fp8Format, HostMatrix, HostQuantized, QuantFormat, Scales, Usage,
};

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

impl GroupedOps<Self> for NdArray {
    /// The splits are read on the host: NdArray has no device to keep them on.
    fn grouped_layout(
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

    fn grouped_quantize(
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

    fn grouped_quantize_fp8_with_scale(
        x: FloatTensor<Self>,
        fp8: Fp8Format,
        scales: ScaleColumns<Self>,
        groups: &Groups<Self>,
        usage: Usage,
        scaling: GroupScaling,
        _record: Option<AmaxHistoryColumns<Self>>,
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
}
