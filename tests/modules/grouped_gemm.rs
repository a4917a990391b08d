//! The grouped GEMM under `GroupedLinear`, on CUDA's paths: fprop and dgrad take the graph-safe
//! pointer array or our Hopper kernel on device splits, the exact batch equals the host-known
//! bound, deferred per-expert scales equal the scale pass, large known groups run per group, and
//! the splits' host copy is seen once it has arrived. Called by `modules.rs`'s CUDA tests.
#![allow(dead_code)]

use burn::backend::Autodiff;
use burn::tensor::{Distribution, Int, Tensor};
use burn_lowp::backend::LowpBackend;
use burn_lowp::nn::{GroupedLinear, GroupedLinearConfig};

use crate::grouped::{grouped, relative_error, splits, turn, values};

type AD<B> = Autodiff<B>;

/// Operands for calling the grouped GEMMs directly on a module of 4 experts of 256 -> 256: X
/// over `layout`'s rows and the experts' stacked W (1024 rows) with their groups, both quantized
/// (rowwise and columnwise) by the module's forward slots; element `i` of operand `w` (0 = X,
/// 1 = W) is `value(w, i)`.
fn expert_operands<B: LowpBackend>(
    m: &GroupedLinear<AD<B>>,
    layout: &burn_lowp::backend::GroupLayout<B>,
    scaling: burn_lowp::format::grouped::GroupScaling,
    device: &B::Device,
    value: impl Fn(usize, usize) -> f32,
) -> (
    burn_lowp::quant::QuantizedTensor<B>,
    burn_lowp::quant::QuantizedTensor<B>,
    burn_lowp::backend::Groups<B>,
) {
    use burn_lowp::format::{grouped::uniform_groups, HostMatrix, InputDtype, Usage};
    let matrix = |rows: usize, w: usize| {
        let values = (0..rows * 256).map(|i| value(w, i)).collect();
        B::bytes_float_from_host(&HostMatrix::new("operand", rows, 256, InputDtype::F32, values).unwrap(), device)
    };
    let both = Usage {
        rowwise: true,
        columnwise: true,
    };
    let quantize = |t, groups, slot: usize| {
        let spec = &m.lowp.quantizers.forward[slot].spec;
        burn_lowp::quant::grouped::quantize_grouped::<B>(t, groups, spec, both, 0, None, scaling).unwrap()
    };
    let qx = quantize(matrix(layout.rows(), 0), &layout.groups, 0);
    let weight_groups =
        burn_lowp::backend::Groups::<B>::from_host(uniform_groups(4, 256), 1024, device).unwrap();
    let qw = quantize(matrix(1024, 1), &weight_groups, 1);
    (qx, qw, weight_groups)
}

/// The graph-safe path (CUDA): under BF16 and FP8 per-tensor recipes, fprop and dgrad run as
/// one pointer-array call over device splits (also with shared expert scales), and a forward reads
/// no split on the host; FP8 block scaling and every wgrad run per group on the host copy of the
/// splits.
pub fn check_grouped_device_splits_path<B: LowpBackend>(device: &B::Device) {
    use burn_lowp::backend::{host_syncs, GemmKind, GemmPath, GroupedGemmPath, GroupedOperand};
    let _turn = turn();
    let case = [300i64, 0, 17, 195];
    let tokens = 512;
    use burn_lowp::format::grouped::GroupScaling;
    for (name, scaling, fprop_dgrad) in [
        ("bf16.json", GroupScaling::PerGroup, GroupedGemmPath::PointerArray(GemmPath::CublasLtHighPrecision)),
        ("current_scaling.json", GroupScaling::PerGroup, GroupedGemmPath::PointerArray(GemmPath::CublasLtFp8Tensor)),
        ("current_scaling.json", GroupScaling::Shared, GroupedGemmPath::PointerArray(GemmPath::CublasLtFp8Tensor)),
        ("block_scaling.json", GroupScaling::PerGroup, GroupedGemmPath::PerGroup(GemmPath::CublasLtFp8Block)),
    ] {
        let m = grouped::<B>(&GroupedLinearConfig::new(4, 256, 256).with_fp8_scales(scaling), name, device);
        let x = Tensor::<AD<B>, 2>::random([tokens, 256], Distribution::Normal(0.0, 1.0), device);
        // Warm up (algorithm selection per shape), then count.
        m.forward(x.clone(), splits::<AD<B>>(&case, device)).unwrap();
        let before = host_syncs();
        let y = m.forward(x.clone(), splits::<AD<B>>(&case, device)).unwrap();
        let reads = host_syncs().since(&before).split_reads;
        let _ = values(y.inner());
        if matches!(fprop_dgrad, GroupedGemmPath::PointerArray(_)) {
            assert_eq!(reads, 0, "{name} {scaling:?}: a graph-safe forward read the splits on the host");
        }
        // The paths the backend picks for these operands (in == out, so X stands for dY too).
        let layout = m.layout(splits::<AD<B>>(&case, device), tokens).unwrap();
        let (qx, qw, weight_groups) =
            expert_operands(&m, &layout, scaling, device, |_, i| ((i % 7) as f32 - 3.0) / 4.0);
        let x_op = GroupedOperand {
            tensor: &qx,
            groups: &layout.groups,
        };
        let w_op = GroupedOperand {
            tensor: &qw,
            groups: &weight_groups,
        };
        for kind in [GemmKind::Fprop, GemmKind::Dgrad] {
            assert_eq!(B::grouped_gemm_path(kind, x_op, w_op), fprop_dgrad, "{name} {scaling:?} {kind:?}");
        }
        assert!(
            matches!(
                B::grouped_gemm_path(GemmKind::Wgrad, x_op, x_op),
                GroupedGemmPath::PerGroup(_)
            ),
            "{name}: wgrad runs per group"
        );
    }
}

/// A grouped GEMM's output: a product (not all zeros) in its group rows, the first `cut` values,
/// and zeros in the rows after the last group.
fn check_product_then_zero_rows(out: &[f32], cut: usize, what: &str) {
    assert!(out[..cut].iter().any(|&v| v != 0.0), "{what}: empty product");
    assert!(out[cut..].iter().all(|&v| v == 0.0), "{what}: rows after the last group are not zero");
}

/// The graph-safe path sizes its batch by what the host knows when the GEMM is queued (CUDA):
/// with the splits' host copy arrived it runs exactly the chunks the groups fill and zeroes the
/// rest of the output, without it the host-known bound of chunks; both give the same numbers,
/// bit for bit, on every group row (the same algorithm runs either way), under BF16 and FP8
/// per-tensor operands (per-expert and shared scales), fprop and dgrad.
pub fn check_grouped_exact_batches_equal_bound<B: LowpBackend>(device: &B::Device) {
    use burn::tensor::TensorPrimitive;
    use burn_lowp::backend::{host_syncs, GemmKind, GemmOptions, GroupedOperand, Groups};
    use burn_lowp::format::grouped::GroupScaling;
    let _turn = turn();
    // Aligned groups of 384, 0, 128 and 256 rows: 6 chunks filled of the bound's 8.
    let case = [300i64, 0, 17, 195];
    let tokens = 512;
    for (name, scaling) in [
        ("bf16.json", GroupScaling::PerGroup),
        ("current_scaling.json", GroupScaling::PerGroup),
        ("current_scaling.json", GroupScaling::Shared),
    ] {
        let m = grouped::<B>(&GroupedLinearConfig::new(4, 256, 256).with_fp8_scales(scaling), name, device);
        let layout = m.layout(splits::<AD<B>>(&case, device), tokens).unwrap();
        // Reads the splits (waits for their copy): the layout's groups are known on the host.
        layout.check().unwrap();
        let filled_rows: usize = 768;
        assert_eq!(layout.rows(), 1024, "the bound of the case");
        let (qx, qw, weight_groups) = expert_operands(&m, &layout, scaling, device, |w, i| {
            (((i * 7 + [1, 5][w]) % 13) as f32 - 6.0) / 8.0
        });
        let unknown = Groups::<B> {
            host: layout.groups.host.unresolved(),
            ..layout.groups.clone()
        };
        for kind in [GemmKind::Fprop, GemmKind::Dgrad] {
            let run = |groups: &Groups<B>| {
                let x_op = GroupedOperand { tensor: &qx, groups };
                let w_op = GroupedOperand {
                    tensor: &qw,
                    groups: &weight_groups,
                };
                let before = host_syncs();
                let out = B::grouped_gemm(kind, x_op, w_op, GemmOptions::default()).unwrap();
                let out = values(Tensor::<B, 2>::from_primitive(TensorPrimitive::Float(out)));
                let counts = host_syncs().since(&before);
                (out, counts.exact_batches, counts.bound_batches, counts.split_reads)
            };
            let (exact, exact_runs, bound_runs, reads) = run(&layout.groups);
            assert_eq!((exact_runs, bound_runs, reads), (1, 0, 0), "{name} {scaling:?} {kind:?}: exact batch");
            let (bound, exact_runs, bound_runs, reads) = run(&unknown);
            assert_eq!((exact_runs, bound_runs, reads), (0, 1, 0), "{name} {scaling:?} {kind:?}: bound batch");
            let cols = exact.len() / 1024;
            let cut = filled_rows * cols;
            assert!(
                exact[..cut] == bound[..cut],
                "{name} {scaling:?} {kind:?}: group rows differ between the exact and the bound batch"
            );
            check_product_then_zero_rows(&exact, cut, &format!("{name} {scaling:?} {kind:?}: the exact batch"));
        }
    }
}

/// The pointer array on per-expert FP8 scales may leave its scale pass to the consumer (CUDA):
/// `grouped_gemm_unscaled` then returns the unit-scale product and the operands' per-expert
/// `scale_inv`, and `grouped_epilogue` with those scales gives the scaled GEMM's token rows bit
/// for bit (fprop and dgrad) and zero padding rows; gathered with the layout's unpad map, the
/// token rows in token order. Shared scales and BF16 leave nothing to the consumer.
pub fn check_grouped_deferred_scales_equal_the_scale_pass<B: LowpBackend>(device: &B::Device) {
    use burn::tensor::TensorPrimitive;
    use burn_lowp::backend::{GemmKind, GemmOptions, GroupEpilogue, GroupedOperand};
    use burn_lowp::format::grouped::GroupScaling;
    let _turn = turn();
    let case = [300i64, 0, 17, 195];
    let tokens = 512;
    for (name, scaling, deferred) in [
        ("current_scaling.json", GroupScaling::PerGroup, true),
        ("current_scaling.json", GroupScaling::Shared, false),
        ("bf16.json", GroupScaling::PerGroup, false),
    ] {
        let m = grouped::<B>(&GroupedLinearConfig::new(4, 256, 256).with_fp8_scales(scaling), name, device);
        let layout = m.layout(splits::<AD<B>>(&case, device), tokens).unwrap();
        let (qx, qw, weight_groups) = expert_operands(&m, &layout, scaling, device, |w, i| {
            (((i * 5 + [2, 9][w]) % 11) as f32 - 5.0) / [4.0, 64.0][w]
        });
        for kind in [GemmKind::Fprop, GemmKind::Dgrad] {
            let x_op = GroupedOperand { tensor: &qx, groups: &layout.groups };
            let w_op = GroupedOperand { tensor: &qw, groups: &weight_groups };
            let what = format!("{name} {scaling:?} {kind:?}");
            let scaled = B::grouped_gemm(kind, x_op, w_op, GemmOptions::default()).unwrap();
            let (unit, scales) = B::grouped_gemm_unscaled(kind, x_op, w_op, GemmOptions::default()).unwrap();
            assert_eq!(scales.is_some(), deferred, "{what}: scales left to the consumer");
            let floats = |t| values(Tensor::<B, 2>::from_primitive(TensorPrimitive::Float(t)));
            let epilogue = |gather| GroupEpilogue { bias: None, scales: scales.clone(), gather };
            let finished = match &scales {
                Some(_) => B::grouped_epilogue(unit.clone(), layout.row_group.clone(), epilogue(None)),
                None => unit.clone(),
            };
            let (scaled, finished) = (floats(scaled), floats(finished));
            // Token rows as the scale pass gives them; padding rows (non-zero in these synthetic
            // operands, zero in a real layout) zero, where the pass scales them as group rows.
            let labels = values(Tensor::<B, 1, Int>::from_primitive(layout.row_group.clone()).float());
            let cols = scaled.len() / layout.rows();
            for (r, &g) in labels.iter().enumerate() {
                let (s_row, f_row) = (&scaled[r * cols..(r + 1) * cols], &finished[r * cols..(r + 1) * cols]);
                if (g as usize) < layout.groups.count || !deferred {
                    assert!(s_row == f_row, "{what}: row {r}: the epilogue's scaling differs from the scale pass");
                } else {
                    assert!(f_row.iter().all(|&v| v == 0.0), "{what}: padding row {r} is not zero");
                }
            }
            if scales.is_some() {
                let tokens_out = floats(B::grouped_epilogue(
                    unit,
                    layout.row_group.clone(),
                    epilogue(Some(layout.packed_to_aligned.clone())),
                ));
                let map = values(Tensor::<B, 1, Int>::from_primitive(layout.packed_to_aligned.clone()).float());
                for (t, &r) in map.iter().enumerate() {
                    let r = r as usize;
                    assert!(
                        tokens_out[t * cols..(t + 1) * cols] == scaled[r * cols..(r + 1) * cols],
                        "{what}: token {t} (aligned row {r}) of the gathered epilogue"
                    );
                }
            }
        }
    }
}

/// FP8 current scaling (E4M3, or E5M2 for the hybrid recipes' gradients) and BF16
/// pass-through: the quantizers the grouped GEMM path checks below compare.
fn fp8_current(fp8: burn_lowp::format::Fp8Format) -> burn_lowp::quant::QuantizerSpec {
    burn_lowp::quant::QuantizerSpec::Fp8Current {
        fp8,
        pow2_scales: false,
        amax_epsilon: 0.0,
    }
}

fn bf16_identity() -> burn_lowp::quant::QuantizerSpec {
    burn_lowp::quant::QuantizerSpec::Identity {
        dtype: burn_lowp::quant::IdentityDtype::Bf16,
    }
}

/// Large groups whose splits the host already knows (CUDA): where every group's GEMM fills the
/// GPU, BF16 dgrad and FP8 fprop/dgrad with per-expert scales run one GEMM per group, the rest
/// keep the pointer array (`backend::per_group_pays`); before the splits' copy has arrived every
/// fprop/dgrad runs the pointer array. Both give the same products on every group row (relative
/// error <= 4e-3: other algorithms, and for per-expert FP8 the pointer array's extra BF16
/// rounding before its scale pass), and the per-group output's tail rows are zero.
pub fn check_grouped_large_known_groups_run_per_group<B: LowpBackend>(device: &B::Device) {
    use burn::tensor::TensorPrimitive;
    use burn_lowp::backend::{GemmKind, GemmOptions, GemmPath, GroupedGemmPath, GroupedOperand, Groups};
    use burn_lowp::format::grouped::{uniform_groups, GroupScaling};
    use burn_lowp::format::Usage;
    use burn_lowp::quant::grouped::quantize_grouped;
    let _turn = turn();
    // Two experts of 4096 aligned rows, 2048 -> 2048: 32 x 16 output tiles per group, three waves
    // on any GPU of up to 170 multiprocessors (an H100 has 132).
    let (features, tokens) = (2048, 8096);
    let case = [4096i64, 4000];
    let layout = B::grouped_layout(splits::<B>(&case, device).into_primitive(), tokens).unwrap();
    layout.check().unwrap();
    let filled = 8192;
    let unknown = Groups::<B> {
        host: layout.groups.host.unresolved(),
        ..layout.groups.clone()
    };
    let weight_groups = Groups::<B>::from_host(uniform_groups(2, features), 2 * features, device).unwrap();
    let x = Tensor::<B, 2>::random([layout.rows(), features], Distribution::Normal(0.0, 1.0), device);
    let w = Tensor::<B, 2>::random([2 * features, features], Distribution::Normal(0.0, 0.02), device);
    let (fp8, bf16) = (fp8_current(burn_lowp::format::Fp8Format::E4M3), bf16_identity());
    let (pa, pg) = (GroupedGemmPath::PointerArray, GroupedGemmPath::PerGroup);
    let (hp, fp8_path) = (GemmPath::CublasLtHighPrecision, GemmPath::CublasLtFp8Tensor);
    for (name, spec, scaling, fprop, dgrad) in [
        ("bf16", &bf16, GroupScaling::PerGroup, pa(hp), pg(hp)),
        ("fp8 per-expert scales", &fp8, GroupScaling::PerGroup, pg(fp8_path), pg(fp8_path)),
        ("fp8 shared scales", &fp8, GroupScaling::Shared, pa(fp8_path), pa(fp8_path)),
    ] {
        let quantize = |t: &Tensor<B, 2>, groups: &Groups<B>| {
            quantize_grouped::<B>(t.clone().into_primitive().tensor(), groups, spec, Usage::BOTH, 0, None, scaling)
                .unwrap()
        };
        let (qx, qw) = (quantize(&x, &layout.groups), quantize(&w, &weight_groups));
        for (kind, want) in [(GemmKind::Fprop, fprop), (GemmKind::Dgrad, dgrad)] {
            let run = |groups: &Groups<B>| {
                let a = GroupedOperand { tensor: &qx, groups };
                let b = GroupedOperand {
                    tensor: &qw,
                    groups: &weight_groups,
                };
                let path = B::grouped_gemm_path(kind, a, b);
                let out = B::grouped_gemm(kind, a, b, GemmOptions::default()).unwrap();
                (path, values(Tensor::<B, 2>::from_primitive(TensorPrimitive::Float(out))))
            };
            let (known_path, known) = run(&layout.groups);
            let (unknown_path, before_copy) = run(&unknown);
            assert_eq!(known_path, want, "{name} {kind:?}: splits on the host");
            assert!(
                matches!(unknown_path, GroupedGemmPath::PointerArray(_)),
                "{name} {kind:?}: before the splits' copy the pointer array runs, not {unknown_path:?}"
            );
            let cut = filled * features;
            let err = relative_error(&known[..cut], &before_copy[..cut]);
            assert!(err <= 4e-3, "{name} {kind:?}: {known_path:?} and the pointer array differ by {err:.2e}");
            check_product_then_zero_rows(&known, cut, &format!("{name} {kind:?}: {known_path:?}"));
        }
    }
}

/// Our Hopper grouped GEMM (CUDA, `GroupedKernel::Sm90`, restored afterwards even on failure):
/// where the splits' host copy has not arrived, a grouped fprop/dgrad with BF16 output runs our
/// kernel instead of cuBLASLt's bound batch (`device_grouped_batches`, not `bound_batches`) and
/// gives cuBLASLt's exact batch's products on every group row (relative error <= 4e-3: another
/// summation order, and for per-expert FP8 scales applied before the one BF16 rounding instead of
/// a scale pass after it), with zeros in the rows past the filled chunks; under BF16 and FP8
/// current scaling (per-expert and shared scales; and the hybrid recipes' dgrad, E5M2 gradient
/// rows with E4M3 weights, per-expert scales), on the skewed splits with an empty expert, at
/// 256 -> 256, 512 -> 384, 2304 -> 384 and 256 -> 2304 features (BF16's cooperative kernels at
/// every length; FP8's pingpong and cooperative kernels). Per-expert scales left to the caller
/// (`grouped_gemm_unscaled`) stay the caller's: the unit-scale product and the epilogue give
/// the same token rows. On a GPU that is not sm_90 (`sm90` false) the setting falls back to the
/// bound batch, which gives the same products.
#[cfg(feature = "cuda")]
pub fn check_grouped_sm90_bound_equals_the_exact_batch<B: LowpBackend>(device: &B::Device, sm90: bool) {
    use burn::tensor::{FloatDType, TensorPrimitive};
    use burn_lowp::backend::cuda::sm90_grouped::{grouped_kernel, set_grouped_kernel, GroupedKernel};
    use burn_lowp::backend::{host_syncs, GemmKind, GemmOptions, GroupEpilogue, GroupedOperand, Groups};
    use burn_lowp::format::grouped::{uniform_groups, GroupScaling};
    use burn_lowp::format::Usage;
    use burn_lowp::quant::grouped::quantize_grouped;
    let _turn = turn();
    /// Puts the setting back when the check ends, failed or not.
    struct Restore(GroupedKernel);
    impl Drop for Restore {
        fn drop(&mut self) {
            set_grouped_kernel(self.0);
        }
    }
    let _restore = Restore(grouped_kernel());
    set_grouped_kernel(GroupedKernel::Sm90);
    // Aligned groups of 384, 0, 128 and 256 rows: 6 chunks filled of the bound's 8.
    let case = [300i64, 0, 17, 195];
    let (tokens, experts, filled_rows) = (512, case.len(), 768);
    let layout = B::grouped_layout(splits::<B>(&case, device).into_primitive(), tokens).unwrap();
    // Reads the splits (waits for their copy): the layout's groups are known on the host.
    layout.check().unwrap();
    assert_eq!(layout.rows(), 1024, "the bound of the case");
    let unknown = Groups::<B> {
        host: layout.groups.host.unresolved(),
        ..layout.groups.clone()
    };
    let labels = values(Tensor::<B, 1, Int>::from_primitive(layout.row_group.clone()).float());
    let (fp8, bf16) = (fp8_current(burn_lowp::format::Fp8Format::E4M3), bf16_identity());
    let fp8_e5m2 = fp8_current(burn_lowp::format::Fp8Format::E5M2);
    let options = || GemmOptions::<B> {
        out_dtype: FloatDType::BF16,
        ..GemmOptions::default()
    };
    let floats = |t| values(Tensor::<B, 2>::from_primitive(TensorPrimitive::Float(t)));
    // FP8's short reductions take the pingpong kernel; 2304 (fprop of the third, dgrad of the
    // fourth) the cooperative one. BF16 is cooperative throughout.
    for (inp, out) in [(256, 256), (512, 384), (2304, 384), (256, 2304)] {
        let weight_groups =
            Groups::<B>::from_host(uniform_groups(experts, out), experts * out, device).unwrap();
        let x = Tensor::<B, 2>::random([layout.rows(), inp], Distribution::Normal(0.0, 1.0), device);
        let dy = Tensor::<B, 2>::random([layout.rows(), out], Distribution::Normal(0.0, 1.0), device);
        let w = Tensor::<B, 2>::random([experts * out, inp], Distribution::Normal(0.0, 0.05), device);
        // (name, the spec of x and w, of dY, scaling, whether the per-expert scales can be left to
        // the caller).
        for (name, spec, dy_spec, scaling, deferrable) in [
            ("bf16", &bf16, &bf16, GroupScaling::PerGroup, false),
            ("fp8 per-expert scales", &fp8, &fp8, GroupScaling::PerGroup, true),
            ("fp8 shared scales", &fp8, &fp8, GroupScaling::Shared, false),
            ("fp8 hybrid per-expert scales", &fp8, &fp8_e5m2, GroupScaling::PerGroup, true),
        ] {
            let quantize = |t: &Tensor<B, 2>, groups: &Groups<B>, spec| {
                quantize_grouped::<B>(t.clone().into_primitive().tensor(), groups, spec, Usage::BOTH, 0, None, scaling)
                    .unwrap()
            };
            let (qx, qdy, qw) = (
                quantize(&x, &layout.groups, spec),
                quantize(&dy, &layout.groups, dy_spec),
                quantize(&w, &weight_groups, spec),
            );
            // (The hybrid fprop is the per-expert case's: E4M3 both sides.)
            let kinds = if name.contains("hybrid") {
                vec![(GemmKind::Dgrad, &qdy)]
            } else {
                vec![(GemmKind::Fprop, &qx), (GemmKind::Dgrad, &qdy)]
            };
            for (kind, rows_operand) in kinds {
                let what = format!("{name} {inp} -> {out} {kind:?}");
                let w_op = GroupedOperand {
                    tensor: &qw,
                    groups: &weight_groups,
                };
                // (out, (exact, bound, device-grouped batches, split reads)).
                let run = |groups: &Groups<B>| {
                    let a = GroupedOperand {
                        tensor: rows_operand,
                        groups,
                    };
                    let before = host_syncs();
                    let out = floats(B::grouped_gemm(kind, a, w_op, options()).unwrap());
                    let c = host_syncs().since(&before);
                    (out, (c.exact_batches, c.bound_batches, c.device_grouped_batches, c.split_reads))
                };
                let (exact, counts) = run(&layout.groups);
                assert_eq!(counts, (1, 0, 0, 0), "{what}: the exact batch (cuBLASLt)");
                let (bound, counts) = run(&unknown);
                let (wanted, ran) = if sm90 {
                    ((0, 0, 1, 0), "our sm90 kernel")
                } else {
                    ((0, 1, 0, 0), "cuBLASLt's bound batch (not an sm_90 GPU)")
                };
                assert_eq!(counts, wanted, "{what}: before the splits' copy, {ran} runs");
                let cols = exact.len() / layout.rows();
                assert_eq!(cols, [out, inp][(kind == GemmKind::Dgrad) as usize], "{what}: output columns");
                let cut = filled_rows * cols;
                let err = relative_error(&bound[..cut], &exact[..cut]);
                assert!(err <= 4e-3, "{what}: {ran} and the exact batch differ by {err:.2e}");
                check_product_then_zero_rows(&exact, cut, &format!("{what}: the exact batch"));
                check_product_then_zero_rows(&bound, cut, &format!("{what}: {ran}"));

                if deferrable {
                    // Deferred scales: the unit-scale product, scaled once by the epilogue.
                    let a = GroupedOperand {
                        tensor: rows_operand,
                        groups: &unknown,
                    };
                    let before = host_syncs();
                    let (unit, scales) = B::grouped_gemm_unscaled(kind, a, w_op, options()).unwrap();
                    assert!(scales.is_some(), "{what}: per-expert scales left to the caller");
                    let finished = floats(B::grouped_epilogue(
                        unit,
                        layout.row_group.clone(),
                        GroupEpilogue {
                            bias: None,
                            scales,
                            gather: None,
                        },
                    ));
                    // (Counted when CubeCL's device thread runs the batch: read after the output.)
                    let c = host_syncs().since(&before);
                    assert_eq!(
                        (c.exact_batches, c.bound_batches, c.device_grouped_batches),
                        (wanted.0, wanted.1, wanted.2),
                        "{what}: deferred scales, before the splits' copy, {ran} runs"
                    );
                    // Token rows (the epilogue zeroes padding rows, which these operands fill).
                    let token_rows = |v: &[f32]| {
                        labels
                            .iter()
                            .enumerate()
                            .filter(|(_, &g)| (g as usize) < experts)
                            .flat_map(|(r, _)| v[r * cols..(r + 1) * cols].to_vec())
                            .collect::<Vec<f32>>()
                    };
                    let err = relative_error(&token_rows(&finished), &token_rows(&exact));
                    assert!(err <= 4e-3, "{what}: deferred scales: {ran} and the exact batch differ by {err:.2e}");
                }
            }
        }
    }
}

/// The splits' host copy is seen as soon as it has arrived, without a read (CUDA, default
/// first-reader resolution): a mark on the stream after the copy tells `try_get`, so a grouped
/// GEMM queued once the GPU has caught up runs its exact batch, and no split read is counted.
pub fn check_grouped_split_copy_is_seen_once_arrived<B: LowpBackend>(device: &B::Device) {
    use burn_lowp::backend::{host_syncs, GemmKind, GemmOptions, GroupedOperand};
    use burn_lowp::format::grouped::GroupScaling;
    let _turn = turn();
    let case = [300i64, 0, 17, 195];
    let m = grouped::<B>(&GroupedLinearConfig::new(4, 256, 256), "bf16.json", device);
    let before = host_syncs();
    let layout = m.layout(splits::<AD<B>>(&case, device), 512).unwrap();
    B::sync(device).unwrap();
    let started = std::time::Instant::now();
    let host = loop {
        if let Some(host) = layout.groups.host.try_get() {
            break host;
        }
        assert!(started.elapsed().as_secs() < 10, "the splits' copy was never seen without a read");
        std::thread::sleep(std::time::Duration::from_millis(1));
    };
    let lens: Vec<usize> = host.groups.iter().map(|g| g.len).collect();
    assert_eq!(lens, [384, 0, 128, 256], "the aligned groups of the case");
    let (qx, qw, weight_groups) =
        expert_operands(&m, &layout, GroupScaling::PerGroup, device, |_, i| ((i % 5) as f32 - 2.0) / 4.0);
    let x_op = GroupedOperand {
        tensor: &qx,
        groups: &layout.groups,
    };
    let w_op = GroupedOperand {
        tensor: &qw,
        groups: &weight_groups,
    };
    let _ = B::grouped_gemm(GemmKind::Fprop, x_op, w_op, GemmOptions::default()).unwrap();
    B::sync(device).unwrap();
    let counts = host_syncs().since(&before);
    assert_eq!(
        (counts.exact_batches, counts.bound_batches, counts.split_reads),
        (1, 0, 0),
        "an exact batch, and no read of the splits"
    );
}
