//! The signature types of a grouped GEMM (`GroupedOps::grouped_gemm`): its operands (a grouped
//! tensor and its groups), the path it takes, and the rules every path shares (output shape,
//! options, when per-group GEMMs beat the pointer array).

use crate::backend::{GemmKind, GemmOptions, GemmPath, LowpBackend, QuantizedTensor, RowGroup};
use crate::error::{LowpError, Result};

use super::Groups;

/// One operand of a grouped GEMM: a grouped tensor and its groups. For fprop and dgrad, operand
/// `a` is the activation or gradient (groups of tokens) and `b` the experts' weights
/// `[count * out, in]` (groups of `out` rows); for wgrad both are activations/gradients.
pub struct GroupedOperand<'a, B: LowpBackend> {
    pub tensor: &'a QuantizedTensor<B>,
    pub groups: &'a Groups<B>,
}

impl<B: LowpBackend> Clone for GroupedOperand<'_, B> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<B: LowpBackend> Copy for GroupedOperand<'_, B> {}

/// How a grouped GEMM runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GroupedGemmPath {
    /// One cuBLASLt call for every group, device splits only (graph-safe): pointer-array batches
    /// of 128-row chunks, BF16 or FP8 per-tensor (with the per-group scales folded into the rows
    /// afterwards).
    PointerArray(GemmPath),
    /// One GEMM per group on the host-known groups, each on the given path.
    PerGroup(GemmPath),
}

/// The operands of a batchable (pointer-array) grouped GEMM, as far as they decide its path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BatchedOperands {
    /// BF16/F16/F32 operands.
    HighPrecision,
    /// FP8 per-tensor operands with one scale per group: in a pointer array their products run
    /// on unit scales and a pass over the output applies each group's scales.
    Fp8PerGroupScales,
    /// FP8 per-tensor operands whose groups share one scale (cuBLASLt applies it; no pass).
    Fp8SharedScales,
}

/// Whether a fprop or dgrad whose groups the host already knows runs one GEMM per group (each
/// of its exact size, spread over streams) rather than the pointer array of 128-row chunks.
/// Only where every group's GEMM is large: the non-empty groups' output averages at least three
/// waves of 128x128 tiles over the device's `multiprocessors` (below that the per-group GEMMs
/// leave the GPU idle between waves: BF16 dgrad at 16 skewed experts, 288 tiles a group on 132
/// multiprocessors, ran at 325 TFLOP/s per group against the pointer array's 533; at 16 experts
/// x 2048 rows, 256 tiles, 0.63-0.76x). Then:
/// * dgrad, BF16 or FP8 with per-group scales: per group (H100, 8 experts x 4096 rows, K = 7168,
///   N = 2048: BF16 644 / 615 TFLOP/s balanced / skewed against the pointer array's 591-598 /
///   567-569; FP8 1056 / 1134 against 791 / 759, which also saves the scale pass);
/// * fprop, FP8 with per-group scales: per group (1326 / 1198 against 1189 / 1090);
/// * BF16 fprop (718 / 636 against 699-718 / 663-680) and FP8 with shared scales (fprop 1297 /
///   1192 against 1361 / 1263; dgrad 1052 / 1095 against 1124 / 1038) keep the pointer array.
/// Measured on an H100 in one run, `benches/results/grouped-per-group-h100/experiment/`.
pub fn per_group_pays(
    kind: GemmKind,
    groups: &[RowGroup],
    out_cols: usize,
    multiprocessors: usize,
    operands: BatchedOperands,
) -> bool {
    let wanted = match (kind, operands) {
        (GemmKind::Wgrad, _) | (_, BatchedOperands::Fp8SharedScales) => false,
        (GemmKind::Dgrad, _) => true,
        (GemmKind::Fprop, BatchedOperands::Fp8PerGroupScales) => true,
        (GemmKind::Fprop, BatchedOperands::HighPrecision) => false,
    };
    let filled: Vec<usize> = groups.iter().map(|g| g.len).filter(|&len| len > 0).collect();
    if !wanted || filled.is_empty() {
        return false;
    }
    let mean_rows = filled.iter().sum::<usize>() / filled.len();
    let tiles = mean_rows.div_ceil(128) * out_cols.div_ceil(128);
    tiles >= 3 * multiprocessors
}

/// Output shape of a grouped GEMM: fprop `[a.rows, b_out]`, dgrad `[a.rows, b.cols]`, wgrad
/// `[count * a.cols, b.cols]` (one `[a.cols, b.cols]` block per group).
pub fn grouped_output_shape<B: LowpBackend>(
    kind: GemmKind,
    a: &GroupedOperand<B>,
    b: &GroupedOperand<B>,
) -> Result<[usize; 2]> {
    let (ta, tb) = (a.tensor, b.tensor);
    if a.groups.count != b.groups.count {
        return Err(LowpError::invalid(
            "grouped GEMM operands",
            format!("{} and {} groups", a.groups.count, b.groups.count),
            "both operands have one group per expert",
        ));
    }
    let count = a.groups.count;
    let per_group_rows = |rows: usize, what: &str| {
        if rows % count != 0 {
            Err(LowpError::shape(
                what,
                format!("{rows} rows"),
                format!("the {count} experts' weights stack to a multiple of {count} rows"),
            ))
        } else {
            Ok(rows / count)
        }
    };
    let (shape, ok) = match kind {
        GemmKind::Fprop => (
            [ta.rows, per_group_rows(tb.rows, "grouped weight")?],
            ta.cols == tb.cols,
        ),
        GemmKind::Dgrad => (
            [ta.rows, tb.cols],
            ta.cols == per_group_rows(tb.rows, "grouped weight")?,
        ),
        GemmKind::Wgrad => ([count * ta.cols, tb.cols], ta.rows == tb.rows),
    };
    if !ok {
        return Err(LowpError::shape(
            format!("{kind:?} grouped GEMM operands"),
            format!("[{}, {}] and [{}, {}]", ta.rows, ta.cols, tb.rows, tb.cols),
            "the contraction dimensions differ",
        ));
    }
    Ok(shape)
}

/// What every grouped GEMM path requires of its options: accumulation into the output in wgrad
/// only, and no `GemmOptions::bias` (an expert's bias is per group: the grouped linear op adds it).
pub(crate) fn check_grouped_options<B: LowpBackend>(
    kind: GemmKind,
    options: &GemmOptions<B>,
) -> Result<()> {
    if options.accumulate.is_some() && kind != GemmKind::Wgrad {
        return Err(LowpError::invalid(
            "accumulate",
            format!("{kind:?}"),
            "grouped GEMMs accumulate into their output in wgrad only",
        ));
    }
    if options.bias.is_some() {
        return Err(LowpError::invalid(
            "GEMM bias",
            "given to a grouped GEMM",
            "a grouped GEMM's biases are per group (the grouped linear op adds them)",
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::RowGroup;

    fn groups(lens: &[usize]) -> Vec<RowGroup> {
        let mut start = 0;
        lens.iter()
            .map(|&len| {
                let g = RowGroup { start, len, used: len };
                start += len;
                g
            })
            .collect()
    }

    /// The measured cases of `per_group_pays` on an H100 (132 multiprocessors).
    #[test]
    fn per_group_gemms_only_where_every_group_fills_the_gpu_and_the_operands_gain() {
        use BatchedOperands::*;
        use GemmKind::*;
        let large = groups(&[4096; 8]);
        // The bench's skewed splits (aligned): 3187, 4579, 8218, 4695, 3438, 4298, 0, 4353 tokens.
        let skewed = groups(&[3200, 4608, 8320, 4736, 3456, 4352, 0, 4480]);
        // 8 experts x 4096 rows, K = 7168, N = 2048: dgrad writes K columns, fprop N.
        for g in [&large, &skewed] {
            assert!(per_group_pays(Dgrad, g, 7168, 132, HighPrecision));
            assert!(per_group_pays(Dgrad, g, 7168, 132, Fp8PerGroupScales));
            assert!(per_group_pays(Fprop, g, 2048, 132, Fp8PerGroupScales));
            assert!(!per_group_pays(Fprop, g, 2048, 132, HighPrecision));
            assert!(!per_group_pays(Dgrad, g, 7168, 132, Fp8SharedScales));
            assert!(!per_group_pays(Fprop, g, 2048, 132, Fp8SharedScales));
            assert!(!per_group_pays(Wgrad, g, 7168, 132, HighPrecision));
        }
        // 16 experts, N = 768: balanced (fprop 16 x 6 tiles, dgrad 16 x 16) and the bench's
        // skewed splits (dgrad 18 x 16 = 288 tiles a group, measured 0.61x the pointer array);
        // 128 experts x 512 rows: the pointer array.
        let sixteen = groups(&[2048; 16]);
        let sixteen_skewed = groups(&[
            2048, 3456, 2944, 640, 896, 512, 2432, 4096, 640, 1152, 896, 4736, 768, 0, 5888, 2432,
        ]);
        for g in [&sixteen, &sixteen_skewed] {
            assert!(!per_group_pays(Fprop, g, 768, 132, Fp8PerGroupScales));
            assert!(!per_group_pays(Dgrad, g, 2048, 132, HighPrecision));
            assert!(!per_group_pays(Dgrad, g, 2048, 132, Fp8PerGroupScales));
        }
        assert!(!per_group_pays(Dgrad, &groups(&[512; 128]), 2048, 132, HighPrecision));
        // The average counts only groups with rows; no rows at all is no GEMM to split.
        assert!(per_group_pays(Dgrad, &groups(&[0, 0, 8192, 0]), 7168, 132, HighPrecision));
        assert!(!per_group_pays(Dgrad, &groups(&[0, 0, 0]), 7168, 132, HighPrecision));
        // Three waves exactly: 33 x 12 tiles = 396 on 132 multiprocessors.
        assert!(per_group_pays(Dgrad, &groups(&[33 * 128]), 1536, 132, HighPrecision));
        assert!(!per_group_pays(Dgrad, &groups(&[32 * 128]), 1536, 132, HighPrecision));
    }
}
