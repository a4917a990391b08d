//! Grouped (MoE) matrices, the executable spec of `cubecl-kernels/src/group_layout.rs` and of the
//! quantize kernels' grouped modes.
//!
//! A grouped matrix `[rows, cols]` holds groups of rows (one per expert) one after another from
//! row 0, each a multiple of [`GROUP_ALIGN`] rows, then a tail of zero rows. Grouped quantization
//! is *defined* as quantizing each group's slice on its own (group g with stochastic-rounding seed
//! `seed + g`) and laying the results out group after group: every representation's codes and
//! block scales of group g sit at `start_g` rows' worth of bytes, and per-tensor values (FP8
//! `scale_inv`, NVFP4 amaxes) at index g of arrays with one value per group. Because groups are
//! whole 128-row chunks, every layout is linear in the rows ([`group_ranges`]).

use std::ops::Range;

use super::config::{codes_shape, quantize, scales_shape, FormatConfig};
use super::matrix::HostMatrix;
use super::quantized::{Direction, HostQuantized, QuantFormat, Usage};
use crate::error::{LowpError, Result};

/// Rows every group is padded to: a GEMM chunk, and a whole number of blocks of every format.
pub const GROUP_ALIGN: usize = 128;

/// How the FP8 per-tensor scales of a grouped matrix are chosen (block-scaled formats ignore it:
/// their scales are per block).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GroupScaling {
    /// Each group its own scale, as quantizing its slice alone would give (TE: one quantizer per
    /// expert).
    #[default]
    PerGroup,
    /// One scale for every group: the scale of the largest group amax (current scaling) or the
    /// smallest group scale (delayed scaling); each group's recorded amax stays its own. Grouped
    /// GEMMs then apply it as cuBLASLt's per-tensor scale instead of a pass over the output that
    /// applies per-group scales; a group whose amax is far below the largest gets coarser codes
    /// (more underflow) than its own scale would give.
    Shared,
}

impl GroupScaling {
    /// The amax a shared current scale is made from: the largest of the groups' amaxes.
    pub fn shared_amax(amaxes: &[f32]) -> f32 {
        amaxes.iter().fold(0.0f32, |a, &b| if b > a { b } else { a })
    }

    /// The shared delayed scale: the smallest of the groups' scales.
    pub fn shared_delayed_scale(scales: &[f32]) -> f32 {
        scales.iter().fold(f32::INFINITY, |a, &b| if b < a { b } else { a })
    }
}

/// Group `g` of a grouped matrix: rows `start .. start + len`, of which the first `used` hold data
/// (tokens) and the rest are zero padding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RowGroup {
    pub start: usize,
    pub len: usize,
    pub used: usize,
}

/// Rows of the aligned matrix of `tokens` tokens in `groups` groups: enough for any splits.
pub fn aligned_rows(tokens: usize, groups: usize) -> usize {
    (tokens + (GROUP_ALIGN - 1) * groups).div_ceil(GROUP_ALIGN) * GROUP_ALIGN
}

/// What the split check found (the device writes the same three words).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SplitStatus {
    Valid,
    /// A negative split (its value, its group).
    Negative { value: i32, group: usize },
    /// The splits sum to `sum` rather than the token count.
    Sum { sum: u32 },
}

impl SplitStatus {
    /// From the device's `[code, value, index]` words.
    pub fn from_words(words: [u32; 3]) -> SplitStatus {
        match words[0] {
            0 => SplitStatus::Valid,
            1 => SplitStatus::Negative {
                value: words[1] as i32,
                group: words[2] as usize,
            },
            _ => SplitStatus::Sum { sum: words[1] },
        }
    }

    pub fn words(self) -> [u32; 3] {
        match self {
            SplitStatus::Valid => [0, 0, 0],
            SplitStatus::Negative { value, group } => [1, value as u32, group as u32],
            SplitStatus::Sum { sum } => [2, sum, 0],
        }
    }

    /// The error this status stands for, naming `tensor`.
    pub fn check(self, tensor: &str, tokens: usize) -> Result<()> {
        match self {
            SplitStatus::Valid => Ok(()),
            SplitStatus::Negative { value, group } => Err(LowpError::invalid(
                format!("{tensor}[{group}]"),
                value,
                "split sizes must not be negative",
            )),
            SplitStatus::Sum { sum } => Err(LowpError::invalid(
                format!("sum of {tensor}"),
                sum,
                format!("must equal the number of tokens (rows of the input), {tokens}"),
            )),
        }
    }
}

/// The layout of packed tokens split into groups, as `group_layout.rs` computes it: negative
/// splits count as 0 and splits are cut where their running sum passes `tokens`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupLayoutHost {
    pub tokens: usize,
    pub rows: usize,
    pub groups: Vec<RowGroup>,
    /// First packed token of each group.
    pub packed_start: Vec<usize>,
    pub status: SplitStatus,
    /// Group of each aligned row (`groups.len()` for padding and tail).
    pub row_group: Vec<i32>,
    /// Packed token of each aligned row (`tokens` for padding and tail).
    pub aligned_to_packed: Vec<i32>,
    /// Aligned row of each packed token.
    pub packed_to_aligned: Vec<i32>,
}

pub fn group_layout(m_splits: &[i32], tokens: usize) -> GroupLayoutHost {
    let count = m_splits.len();
    let rows = aligned_rows(tokens, count);
    let (mut packed, mut aligned, mut sum) = (0usize, 0usize, 0u32);
    let mut status = SplitStatus::Valid;
    let mut groups = Vec::with_capacity(count);
    let mut packed_start = Vec::with_capacity(count);
    for (g, &m) in m_splits.iter().enumerate() {
        let mut used = 0usize;
        if m < 0 {
            if status == SplitStatus::Valid {
                status = SplitStatus::Negative { value: m, group: g };
            }
        } else {
            used = m as usize;
            sum = sum.saturating_add(m as u32);
        }
        used = used.min(tokens - packed);
        let len = used.div_ceil(GROUP_ALIGN) * GROUP_ALIGN;
        packed_start.push(packed);
        groups.push(RowGroup {
            start: aligned,
            len,
            used,
        });
        packed += used;
        aligned += len;
    }
    if status == SplitStatus::Valid && sum as usize != tokens {
        status = SplitStatus::Sum { sum };
    }
    let mut row_group = vec![count as i32; rows];
    let mut aligned_to_packed = vec![tokens as i32; rows];
    let mut packed_to_aligned = vec![(rows - 1) as i32; tokens];
    for (g, group) in groups.iter().enumerate() {
        for i in 0..group.used {
            row_group[group.start + i] = g as i32;
            aligned_to_packed[group.start + i] = (packed_start[g] + i) as i32;
            packed_to_aligned[packed_start[g] + i] = (group.start + i) as i32;
        }
    }
    GroupLayoutHost {
        tokens,
        rows,
        groups,
        packed_start,
        status,
        row_group,
        aligned_to_packed,
        packed_to_aligned,
    }
}

/// `count` groups of `len` rows each (all used): the experts' weights `[count * len, cols]`.
pub fn uniform_groups(count: usize, len: usize) -> Vec<RowGroup> {
    (0..count)
        .map(|g| RowGroup {
            start: g * len,
            len,
            used: len,
        })
        .collect()
}

/// Checks that `groups` tile the first rows of a `[rows, _]` grouped matrix in whole chunks.
pub fn check_groups(tensor: &str, groups: &[RowGroup], rows: usize) -> Result<()> {
    if groups.is_empty() {
        return Err(LowpError::invalid(
            format!("groups of `{tensor}`"),
            0,
            "a grouped matrix has at least one group",
        ));
    }
    let mut next = 0;
    for (g, group) in groups.iter().enumerate() {
        if group.start != next || group.len % GROUP_ALIGN != 0 || group.used > group.len {
            return Err(LowpError::shape(
                tensor,
                format!("group {g} {group:?}"),
                format!("groups follow each other from row 0 in multiples of {GROUP_ALIGN} rows"),
            ));
        }
        next += group.len;
    }
    if next > rows || rows % GROUP_ALIGN != 0 {
        return Err(LowpError::shape(
            tensor,
            format!("{rows} rows for groups covering {next}"),
            format!("the groups fit in the matrix, whose rows are a multiple of {GROUP_ALIGN}"),
        ));
    }
    Ok(())
}

/// Where group `g` lies in one representation of a grouped quantized matrix with `cols` columns:
/// byte ranges of its codes and block scales, and for per-tensor values (FP8 `scale_inv` and
/// amax, NVFP4 amax) the index `g` of the per-group arrays.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupRanges {
    pub codes: Range<usize>,
    /// Bytes of the block scales (empty for FP8 per-tensor, whose scale is per group).
    pub scales: Range<usize>,
}

fn bytes_of(shape: [usize; 2], element: usize) -> usize {
    shape[0] * shape[1] * element
}

pub fn group_ranges(
    format: &QuantFormat,
    direction: Direction,
    cols: usize,
    group: RowGroup,
) -> GroupRanges {
    // Every layout is linear in the rows for whole 128-row chunks: the bytes of one chunk times
    // the chunks before the group.
    let scale_element = match format {
        QuantFormat::Fp8Tensor { .. } => 0,
        QuantFormat::Fp8Block { .. } => 4,
        QuantFormat::Mxfp8 { .. } | QuantFormat::Nvfp4 { .. } => 1,
    };
    let chunk = |rows: usize| {
        (
            bytes_of(codes_shape(format, rows, cols, direction), 1),
            bytes_of(scales_shape(format, rows, cols, direction), scale_element),
        )
    };
    let (codes_per_chunk, scales_per_chunk) = chunk(GROUP_ALIGN);
    let (chunks_before, chunks) = (group.start / GROUP_ALIGN, group.len / GROUP_ALIGN);
    GroupRanges {
        codes: codes_per_chunk * chunks_before..codes_per_chunk * (chunks_before + chunks),
        scales: scales_per_chunk * chunks_before..scales_per_chunk * (chunks_before + chunks),
    }
}

/// The values of group `group`'s rows of the grouped matrix `x`, row-major.
pub fn group_values(x: &HostMatrix, group: RowGroup) -> &[f32] {
    &x.values[group.start * x.cols..(group.start + group.len) * x.cols]
}

/// Group `group`'s rows of `x` as a matrix of their own (one group's slice).
pub fn group_slice(x: &HostMatrix, group: RowGroup) -> Result<HostMatrix> {
    HostMatrix::new(&x.name, group.len, x.cols, x.dtype, group_values(x, group).to_vec())
}

/// The reference grouped quantizer: each group's rows `[start, start + len)` quantized on their own
/// (NVFP4 stochastic rounding with seed `seed + g`); `None` for empty groups.
pub fn quantize_groups(
    x: &HostMatrix,
    groups: &[RowGroup],
    config: &FormatConfig,
    usage: Usage,
) -> Result<Vec<Option<HostQuantized>>> {
    check_groups(&x.name, groups, x.rows)?;
    groups
        .iter()
        .enumerate()
        .map(|(g, group)| {
            if group.len == 0 {
                return Ok(None);
            }
            quantize(&group_slice(x, *group)?, &group_config(config, g), usage).map(Some)
        })
        .collect()
}

/// Group g's configuration: NVFP4 stochastic rounding seeded with `seed + g`.
pub fn group_config(config: &FormatConfig, g: usize) -> FormatConfig {
    match config {
        FormatConfig::Nvfp4(c) => FormatConfig::Nvfp4(super::Nvfp4Config {
            stochastic_seed: c.stochastic_seed.map(|s| s.wrapping_add(g as u64)),
            ..*c
        }),
        other => *other,
    }
}
