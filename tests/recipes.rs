//! Recipes and quantizers: every recipe file parses and resolves every slot of every module type
//! to TE's quantizer; hybrid and identity quantizers; delayed-scaling state against TE's rule step
//! by step; and every invalid recipe gives its error.

mod common;

use std::path::PathBuf;

use burn::backend::NdArray;
use burn::tensor::Tensor;
use burn_lowp::backend::LowpBackend;
use burn_lowp::format::fp8_block::BlockShape;
use burn_lowp::format::{Direction, Fp8Format, HostMatrix, InputDtype, Usage};
use burn_lowp::quant::{
    quantize, AmaxComputeAlgo, ColumnwiseSource, DelayedScalingConfig, DelayedScalingState,
    Fp8Recipe, IdentityDtype, QuantizeCall, QuantizerSpec, Storage,
};
use burn_lowp::recipe::{
    resolve_slots, BoundaryRoles, ModuleKind, Mxfp8Recipe, Pass, QuantizerRole, Recipe, SlotLayout,
};

fn recipe_path(name: &str) -> PathBuf {
    common::recipes_dir().join(name)
}

const FILES: [&str; 9] = [
    "delayed_scaling.json",
    "current_scaling.json",
    "current_scaling_fast_accumulation.json",
    "block_scaling.json",
    "mxfp8.json",
    "nvfp4.json",
    "bf16.json",
    "mxfp8_fwd_nvfp4_bwd.json",
    "nvfp4_keep_first_last_bf16.json",
];

fn layouts() -> Vec<SlotLayout> {
    let boundary = BoundaryRoles {
        output: Some(QuantizerRole::new("linear", "input", "next")),
        grad_input: None,
    };
    vec![
        SlotLayout::new(ModuleKind::Linear, "layers.3.proj", &boundary),
        SlotLayout::new(
            ModuleKind::LayerNormLinear,
            "layers.3.qkv",
            &BoundaryRoles::default(),
        ),
        SlotLayout::new(
            ModuleKind::LayerNormMlp,
            "layers.3.mlp",
            &BoundaryRoles::default(),
        ),
        SlotLayout::new(
            ModuleKind::GroupedLinear { num_gemms: 3 },
            "layers.3.experts",
            &BoundaryRoles::default(),
        ),
    ]
}

#[test]
fn slot_layouts_are_tes() {
    let r = |m: &str, t: &str, n: &str| Some(QuantizerRole::new(m, t, n));
    let mlp = SlotLayout::new(ModuleKind::LayerNormMlp, "mlp", &BoundaryRoles::default());
    assert_eq!(
        mlp.forward,
        vec![
            r("linear", "input", "mlp.fc1"),
            r("linear", "weight", "mlp.fc1"),
            r("linear", "input", "mlp.fc2"),
            r("linear", "input", "mlp.fc2"),
            r("linear", "weight", "mlp.fc2"),
            None
        ]
    );
    assert_eq!(
        mlp.backward,
        vec![
            r("linear", "grad_output", "mlp.fc1"),
            None,
            r("linear", "grad_output", "mlp.fc2"),
            r("linear", "grad_output", "mlp.fc1")
        ]
    );
    let unnamed = SlotLayout::new(ModuleKind::LayerNormMlp, "", &BoundaryRoles::default());
    assert_eq!(unnamed.forward[1], r("linear", "weight", "fc1"));
    let boundary = BoundaryRoles {
        output: r("dpa", "qkv", ""),
        grad_input: r("linear", "grad_output", "prev"),
    };
    let linear = SlotLayout::new(ModuleKind::Linear, "proj", &boundary);
    assert_eq!(
        linear.forward,
        vec![
            r("linear", "input", "proj"),
            r("linear", "weight", "proj"),
            r("dpa", "qkv", "")
        ]
    );
    assert_eq!(
        linear.backward,
        vec![
            r("linear", "grad_output", "proj"),
            r("linear", "grad_output", "prev")
        ]
    );
    let grouped = SlotLayout::new(
        ModuleKind::GroupedLinear { num_gemms: 2 },
        "experts",
        &BoundaryRoles::default(),
    );
    assert_eq!(grouped.forward.len(), 6);
    assert_eq!(grouped.backward.len(), 4);
    assert_eq!(grouped.forward[4], r("grouped_linear", "weight", "experts"));
    assert_eq!(
        grouped.backward[2],
        r("grouped_linear", "grad_output", "experts")
    );
    assert_eq!(grouped.forward[5], None);
    assert_eq!(
        QuantizerRole::new("linear", "weight", "fc1").to_string(),
        "linear|weight|fc1"
    );
}

#[test]
fn every_recipe_file_parses_validates_and_round_trips() {
    for file in FILES {
        let recipe = Recipe::load(recipe_path(file)).unwrap_or_else(|e| panic!("{file}: {e}"));
        assert!(
            recipe.validate().unwrap().is_empty(),
            "{file}: unexpected warnings"
        );
        assert_eq!(
            Recipe::from_json(&recipe.to_json()).unwrap(),
            recipe,
            "{file}: JSON round trip"
        );
    }
}

/// TE's tables (spec sections 1-6), per slot tensor type and pass.
fn expected(file: &str, slot: &burn_lowp::recipe::SlotQuantizer, pass: Pass) -> QuantizerSpec {
    let forward = pass == Pass::Forward;
    let t = slot.tensor_type.as_str();
    let nv = |block_2d, rht, stochastic_rounding| QuantizerSpec::Nvfp4 {
        block_2d,
        rht,
        stochastic_rounding,
    };
    let mx = QuantizerSpec::Mxfp8 {
        fp8: Fp8Format::E4M3,
        block_2d: false,
    };
    match file {
        "delayed_scaling.json" => QuantizerSpec::Fp8Delayed(DelayedScalingConfig::default()),
        "current_scaling.json" | "current_scaling_fast_accumulation.json" => QuantizerSpec::Fp8Current {
            fp8: if forward {
                Fp8Format::E4M3
            } else {
                Fp8Format::E5M2
            },
            pow2_scales: false,
            amax_epsilon: 0.0,
        },
        "block_scaling.json" => QuantizerSpec::Fp8Block {
            fp8: Fp8Format::E4M3,
            block: if forward && t == "weight" {
                BlockShape::OneTwentyEightSquare
            } else {
                BlockShape::OneByOneTwentyEight
            },
            pow2_scales: true,
            amax_epsilon: 0.0,
        },
        "mxfp8.json" => mx,
        "nvfp4.json" => match (forward, t) {
            (true, "weight") => nv(true, false, false),
            (true, _) => nv(false, true, false),
            (false, _) => nv(false, true, true),
        },
        "bf16.json" => QuantizerSpec::Identity {
            dtype: IdentityDtype::Bf16,
        },
        "mxfp8_fwd_nvfp4_bwd.json" => match (&slot.role, t) {
            (None, _) => mx,
            (_, "input") => QuantizerSpec::Hybrid {
                rowwise: Box::new(mx.clone()),
                columnwise: Box::new(nv(false, true, false)),
                columnwise_source: ColumnwiseSource::Original,
            },
            (_, "weight") => QuantizerSpec::Hybrid {
                rowwise: Box::new(mx.clone()),
                columnwise: Box::new(nv(true, false, false)),
                columnwise_source: ColumnwiseSource::Original,
            },
            (_, "grad_output") => nv(false, true, true),
            _ => mx,
        },
        "nvfp4_keep_first_last_bf16.json" => match (&slot.role, t) {
            (Some(r), _) if r.name.starts_with("layers.0.") || r.name.starts_with("lm_head") => {
                QuantizerSpec::Identity {
                    dtype: IdentityDtype::Bf16,
                }
            }
            (Some(_), "weight") => nv(true, false, false),
            (Some(_), "grad_output") => nv(false, true, true),
            _ => nv(false, true, false),
        },
        other => panic!("no expectation for {other}"),
    }
}

#[test]
fn every_recipe_file_resolves_every_slot_of_every_module() {
    let mut slots = 0;
    for file in FILES {
        let recipe = Recipe::load(recipe_path(file)).unwrap();
        for layout in layouts() {
            let q = recipe
                .resolve(&layout)
                .unwrap_or_else(|e| panic!("{file} {}: {e}", layout.name));
            assert_eq!(q.forward.len(), layout.forward.len());
            assert_eq!(q.backward.len(), layout.backward.len());
            for (pass, resolved) in [(Pass::Forward, &q.forward), (Pass::Backward, &q.backward)] {
                for (i, slot) in resolved.iter().enumerate() {
                    assert_eq!(
                        slot.spec,
                        expected(file, slot, pass),
                        "{file} {} {pass:?} slot {i} ({:?})",
                        layout.name,
                        slot.role
                    );
                    slots += 1;
                }
            }
            assert_eq!(
                q.delayed.is_some(),
                file == "delayed_scaling.json",
                "{file}: delayed state"
            );
            assert!(q.warnings.is_empty(), "{file}: {:?}", q.warnings);
        }
    }
    // The keep-first-last recipe really keeps first and last layers in BF16.
    let keep = Recipe::load(recipe_path("nvfp4_keep_first_last_bf16.json")).unwrap();
    for (name, bf16) in [
        ("layers.0.qkv", true),
        ("lm_head", true),
        ("layers.7.qkv", false),
    ] {
        let layout = SlotLayout::new(ModuleKind::LayerNormLinear, name, &BoundaryRoles::default());
        let q = keep.resolve(&layout).unwrap();
        assert_eq!(
            matches!(q.forward[1].spec, QuantizerSpec::Identity { .. }),
            bf16,
            "{name}"
        );
        slots += 1;
    }
    println!("{slots} slots resolved as TE's tables say");
}

#[test]
fn slot_types_fall_back_to_position_and_mxfp8_2d_follows_roles() {
    // LayerNormMLP slot 2 is labelled (linear, input, fc2): an input, so MXFP8 2D skips it; only
    // the two forward weight slots get 32x32 blocks.
    let recipe = Recipe::Mxfp8(Mxfp8Recipe {
        fp8_format: Fp8Recipe::Hybrid,
        enable_2d_quantization: true,
    });
    let layout = SlotLayout::new(ModuleKind::LayerNormMlp, "mlp", &BoundaryRoles::default());
    let q = recipe.resolve(&layout).unwrap();
    let two_d: Vec<bool> = q
        .forward
        .iter()
        .map(|s| matches!(s.spec, QuantizerSpec::Mxfp8 { block_2d: true, .. }))
        .collect();
    assert_eq!(two_d, vec![false, true, false, false, true, false]);
    // Hybrid format: gradients in E5M2; the unset boundary output slot falls back to position 5 % 3.
    assert!(q.backward.iter().all(|s| matches!(
        s.spec,
        QuantizerSpec::Mxfp8 {
            fp8: Fp8Format::E5M2,
            ..
        }
    )));
    assert_eq!(q.forward[5].tensor_type, "output");
}

#[test]
fn a_closure_factory_is_the_programmatic_twin_of_a_custom_recipe() {
    let file = Recipe::load(recipe_path("mxfp8_fwd_nvfp4_bwd.json")).unwrap();
    let Recipe::Custom(custom) = &file else {
        panic!()
    };
    for layout in layouts() {
        let from_closure =
            resolve_slots(&layout, |role, _, _| custom.quantizer(role).clone()).unwrap();
        assert_eq!(from_closure, file.resolve(&layout).unwrap());
    }
}

fn input(rows: usize, cols: usize, seed: u64) -> HostMatrix {
    let mut x = common::random_matrix(rows, cols, seed, 4.0);
    x.dtype = InputDtype::F32;
    x
}

/// A hybrid quantizer whose two sides are the same format gives the plain quantizer's bytes.
fn check_hybrid_equal_sides<B: LowpBackend>(device: &B::Device) {
    let plain = [
        QuantizerSpec::Fp8Current {
            fp8: Fp8Format::E4M3,
            pow2_scales: false,
            amax_epsilon: 0.0,
        },
        QuantizerSpec::Fp8Current {
            fp8: Fp8Format::E5M2,
            pow2_scales: true,
            amax_epsilon: 0.0,
        },
        QuantizerSpec::Fp8Block {
            fp8: Fp8Format::E4M3,
            block: BlockShape::OneByOneTwentyEight,
            pow2_scales: true,
            amax_epsilon: 0.0,
        },
        QuantizerSpec::Fp8Block {
            fp8: Fp8Format::E4M3,
            block: BlockShape::OneTwentyEightSquare,
            pow2_scales: true,
            amax_epsilon: 0.0,
        },
        QuantizerSpec::Mxfp8 {
            fp8: Fp8Format::E4M3,
            block_2d: false,
        },
        QuantizerSpec::Mxfp8 {
            fp8: Fp8Format::E5M2,
            block_2d: true,
        },
        QuantizerSpec::Nvfp4 {
            block_2d: false,
            rht: false,
            stochastic_rounding: false,
        },
        QuantizerSpec::Nvfp4 {
            block_2d: true,
            rht: false,
            stochastic_rounding: false,
        },
        QuantizerSpec::Nvfp4 {
            block_2d: false,
            rht: true,
            stochastic_rounding: true,
        },
    ];
    let x = input(128, 256, 17);
    let call = QuantizeCall::<B>::new(99);
    for spec in plain {
        let hybrid = QuantizerSpec::Hybrid {
            rowwise: Box::new(spec.clone()),
            columnwise: Box::new(spec.clone()),
            columnwise_source: ColumnwiseSource::Original,
        };
        for swizzle in [false, true] {
            let a = quantize::<B>(
                B::bytes_float_from_host(&x, device),
                &spec,
                Usage::BOTH,
                swizzle,
                &call,
            )
            .unwrap();
            let b = quantize::<B>(
                B::bytes_float_from_host(&x, device),
                &hybrid,
                Usage::BOTH,
                swizzle,
                &call,
            )
            .unwrap();
            assert_eq!(
                a.to_host().unwrap(),
                b.to_host().unwrap(),
                "{} (swizzled {swizzle})",
                spec.name()
            );
        }
    }
}

/// `rowwise_dequantized`: the columnwise copy is quantize(dequantize(rowwise)).
fn check_rowwise_dequantized_source<B: LowpBackend>(device: &B::Device) {
    let x = input(128, 256, 5);
    let call = QuantizeCall::<B>::new(3);
    let row = QuantizerSpec::Mxfp8 {
        fp8: Fp8Format::E4M3,
        block_2d: false,
    };
    let col = QuantizerSpec::Nvfp4 {
        block_2d: false,
        rht: true,
        stochastic_rounding: false,
    };
    let hybrid = QuantizerSpec::Hybrid {
        rowwise: Box::new(row.clone()),
        columnwise: Box::new(col.clone()),
        columnwise_source: ColumnwiseSource::RowwiseDequantized,
    };
    let q = quantize::<B>(
        B::bytes_float_from_host(&x, device),
        &hybrid,
        Usage::BOTH,
        false,
        &call,
    )
    .unwrap();
    let rowwise = quantize::<B>(
        B::bytes_float_from_host(&x, device),
        &row,
        Usage::ROWWISE,
        false,
        &call,
    )
    .unwrap();
    let dequantized = B::quantize_dequantize(&rowwise, Direction::Rowwise).unwrap();
    let expected = quantize::<B>(dequantized, &col, Usage::COLUMNWISE, false, &call).unwrap();
    let (Some(Storage::Quantized(got)), Some(Storage::Quantized(want))) =
        (&q.columnwise, &expected.columnwise)
    else {
        panic!()
    };
    assert_eq!(got.format, want.format);
    assert_eq!(got.to_host(), want.to_host());
    let (Some(Storage::Quantized(got_row)), Some(Storage::Quantized(want_row))) =
        (&q.rowwise, &rowwise.rowwise)
    else {
        panic!()
    };
    assert_eq!(got_row.to_host(), want_row.to_host());
    // And it differs from quantizing the original (the point of the option).
    let original = quantize::<B>(
        B::bytes_float_from_host(&x, device),
        &col,
        Usage::COLUMNWISE,
        false,
        &call,
    )
    .unwrap();
    let Some(Storage::Quantized(orig)) = &original.columnwise else {
        panic!()
    };
    assert_ne!(orig.to_host(), got.to_host());
    // A mixed hybrid cannot be read back as one host tensor, each storage can.
    assert!(q.to_host().is_err());
}

fn check_identity_and_narrowing<B: LowpBackend>(device: &B::Device) {
    let x = input(32, 64, 8);
    let call = QuantizeCall::<B>::new(0);
    let q = quantize::<B>(
        B::bytes_float_from_host(&x, device),
        &QuantizerSpec::Identity {
            dtype: IdentityDtype::F32,
        },
        Usage::BOTH,
        false,
        &call,
    )
    .unwrap();
    let back = common::read_f32::<B>(B::quantize_dequantize(&q, Direction::Columnwise).unwrap());
    assert_eq!(back, x.values, "identity keeps the tensor");
    let q = quantize::<B>(
        B::bytes_float_from_host(&x, device),
        &QuantizerSpec::Mxfp8 {
            fp8: Fp8Format::E4M3,
            block_2d: false,
        },
        Usage::BOTH,
        false,
        &call,
    )
    .unwrap();
    let narrowed = q.clone().narrow(Usage::COLUMNWISE).unwrap();
    assert!(narrowed.rowwise.is_none() && narrowed.columnwise.is_some());
    assert!(
        narrowed.clone().narrow(Usage::ROWWISE).is_err(),
        "a dropped direction cannot come back"
    );
    assert!(B::quantize_dequantize(&narrowed, Direction::Rowwise).is_err());
    assert_eq!(
        B::quantize_dequantize(&narrowed, Direction::Columnwise)
            .map(common::read_f32::<B>)
            .unwrap(),
        B::quantize_dequantize(&q, Direction::Columnwise)
            .map(common::read_f32::<B>)
            .unwrap()
    );
}

#[test]
fn hybrid_identity_and_narrowing_on_ndarray() {
    let device = Default::default();
    check_hybrid_equal_sides::<NdArray>(&device);
    check_rowwise_dequantized_source::<NdArray>(&device);
    check_identity_and_narrowing::<NdArray>(&device);
}

#[cfg(feature = "wgpu")]
#[test]
fn hybrid_identity_and_narrowing_on_wgpu() {
    use burn_lowp_kernels::cubecl::wgpu::{WgpuDevice, WgpuRuntime};
    type B = burn_cubecl::CubeBackend<WgpuRuntime, f32, i32, u32>;
    let required = std::env::var("LOWP_REQUIRE_WGPU").is_ok_and(|v| v == "1");
    if !burn_lowp::backend::device::wgpu_available() {
        assert!(!required, "LOWP_REQUIRE_WGPU=1 but no Vulkan adapter");
        eprintln!("skipping wgpu: no Vulkan adapter");
        return;
    }
    let device = WgpuDevice::default();
    check_hybrid_equal_sides::<B>(&device);
    check_rowwise_dequantized_source::<B>(&device);
    check_identity_and_narrowing::<B>(&device);
}

fn values<const D: usize>(t: Tensor<NdArray, D>) -> Vec<f32> {
    t.into_data().convert::<f32>().into_vec::<f32>().unwrap()
}

#[test]
fn delayed_scaling_follows_tes_rule_step_by_step() {
    let device = Default::default();
    let config = DelayedScalingConfig {
        fp8_format: Fp8Recipe::Hybrid,
        margin: 0,
        amax_history_len: 3,
        amax_compute_algo: AmaxComputeAlgo::Max,
    };
    let state = DelayedScalingState::<NdArray>::new(&config, 2, &device);
    let inf = f32::INFINITY;
    // (amaxes recorded in the step, scales after the update, history after the roll), E4M3: 448.
    let script: [([f32; 2], [f32; 2], [[f32; 2]; 3]); 6] = [
        (
            [2.0, 0.0],
            [224.0, 1.0],
            [[0.0, 0.0], [0.0, 0.0], [2.0, 0.0]],
        ), // zero amax keeps scale 1
        (
            [4.0, 1.0],
            [112.0, 448.0],
            [[0.0, 0.0], [2.0, 0.0], [4.0, 1.0]],
        ),
        (
            [1.0, inf],
            [112.0, 448.0],
            [[0.0, 0.0], [4.0, 1.0], [1.0, inf]],
        ), // Inf keeps the old scale
        (
            [0.5, 2.0],
            [112.0, 448.0],
            [[0.0, 0.0], [1.0, inf], [0.5, 2.0]],
        ), // max still sees the Inf
        (
            [0.5, 2.0],
            [448.0, 448.0],
            [[0.0, 0.0], [0.5, 2.0], [0.5, 2.0]],
        ),
        (
            [3.0, 2.0],
            [448.0 / 3.0, 224.0],
            [[0.0, 0.0], [0.5, 2.0], [3.0, 2.0]],
        ),
    ];
    for (step, (amax, scales, history)) in script.iter().enumerate() {
        for (slot, &a) in amax.iter().enumerate() {
            // Two calls in one step (micro batches): the larger amax is kept.
            state.record_amax(slot, Tensor::from_floats([a * 0.5], &device));
            state.record_amax(slot, Tensor::from_floats([a], &device));
        }
        state.update(&config, Fp8Format::E4M3).unwrap();
        assert_eq!(
            values(state.scale.value()),
            scales.to_vec(),
            "step {step}: scales"
        );
        assert_eq!(
            values(state.amax_history.value()),
            history.concat(),
            "step {step}: history"
        );
    }

    // most_recent with margin 1: scale = 448 / 2 / history[0], before the roll; E5M2 slots.
    let config = DelayedScalingConfig {
        margin: 1,
        amax_compute_algo: AmaxComputeAlgo::MostRecent,
        amax_history_len: 2,
        ..config
    };
    let state = DelayedScalingState::<NdArray>::new(&config, 1, &device);
    for (a, expected) in [
        (8.0f32, 57344.0 / 2.0 / 8.0),
        (0.0, 57344.0 / 2.0 / 8.0),
        (1.0e-45, f32::MAX),
        (2.0, 57344.0 / 2.0 / 2.0),
    ] {
        state.record_amax(0, Tensor::from_floats([a], &device));
        state.update(&config, Fp8Format::E5M2).unwrap();
        assert_eq!(values(state.scale.value()), vec![expected], "amax {a}");
    }
}

/// TE's default history (1024 steps, `max`), long enough for the blocked maximum: each slot's
/// scale comes from the largest amax of the last 1024 steps (an amax of 896 recorded at step 7
/// rules until step 1030), and a NaN in the history never becomes a scale.
#[test]
fn delayed_scaling_max_over_a_long_history() {
    let device = Default::default();
    let config = DelayedScalingConfig::default();
    assert_eq!(config.amax_history_len, 1024);
    assert_eq!(config.amax_compute_algo, AmaxComputeAlgo::Max);
    let state = DelayedScalingState::<NdArray>::new(&config, 3, &device);
    let amax = |step: usize, slot: usize| match (slot, step) {
        (0, _) => 1.0 + (step % 97) as f32,
        (1, 7) => 896.0,
        (1, _) => 0.5,
        (_, 40) => f32::NAN,
        _ => 2.0,
    };
    for step in 0..1100 {
        for slot in 0..3 {
            state.record_amax(slot, Tensor::from_floats([amax(step, slot)], &device));
        }
        state.update(&config, Fp8Format::E4M3).unwrap();
        let largest = |slot: usize| {
            (step.saturating_sub(1023)..=step)
                .map(|s| amax(s, slot))
                .fold(f32::MIN, f32::max)
        };
        let scales = values(state.scale.value());
        assert_eq!(scales[0], 448.0 / largest(0), "step {step}, slot 0");
        assert_eq!(scales[1], 448.0 / largest(1), "step {step}, slot 1");
        assert_eq!(scales[2], 224.0, "step {step}, slot 2");
    }
}

#[test]
fn delayed_scaling_state_is_saved_and_loaded_with_the_record() {
    use burn::module::Module;
    use burn::record::{BinBytesRecorder, FullPrecisionSettings, Recorder};
    let device = Default::default();
    let config = DelayedScalingConfig {
        amax_history_len: 4,
        ..Default::default()
    };
    let state = DelayedScalingState::<NdArray>::new(&config, 3, &device);
    state.record_amax(1, Tensor::from_floats([7.0], &device));
    state.update(&config, Fp8Format::E4M3).unwrap();
    let recorder = BinBytesRecorder::<FullPrecisionSettings>::default();
    let bytes = recorder.record(state.clone().into_record(), ()).unwrap();
    let loaded = DelayedScalingState::<NdArray>::new(&config, 3, &device)
        .load_record(Recorder::<NdArray>::load(&recorder, bytes, &device).unwrap());
    assert_eq!(values(loaded.scale.value()), values(state.scale.value()));
    assert_eq!(
        values(loaded.amax_history.value()),
        values(state.amax_history.value())
    );
    assert_eq!(values(loaded.scale.value())[1], 64.0);
}

#[test]
fn invalid_recipes_give_their_errors() {
    let cases: [(&str, &[&str]); 17] = [
        (
            r#"{"recipe":"custom","rules":[{"match":{"tensor_type":"wieght"},"quantizer":{"format":"mxfp8"}}],"default":{"format":"mxfp8"}}"#,
            &["rules[0].match.tensor_type", "\"wieght\"", "no slot of any module", "weight"],
        ),
        (
            r#"{"recipe":"custom","rules":[{"match":{"name":"fc1"},"quantizer":{"format":"mxfp8"}},{"match":{"module_type":"layernorm_linear"},"quantizer":{"format":"mxfp8"}}],"default":{"format":"mxfp8"}}"#,
            &["rules[1].match.module_type", "layernorm_linear", "linear, grouped_linear, dpa"],
        ),
        (
            r#"{"recipe":"custom","rules":[{"match":{"module_type":"grouped_linear","tensor_type":"qkv"},"quantizer":{"format":"mxfp8"}}],"default":{"format":"mxfp8"}}"#,
            &["rules[0].match.tensor_type", "`grouped_linear` module"],
        ),
        (
            r#"{"recipe":"mxfp8","fp8_format":"e5m2"}"#,
            &["fp8_format", "pure E5M2"],
        ),
        (
            r#"{"recipe":"delayed_scaling","fp8_format":"e5m2"}"#,
            &["recipe.fp8_format", "pure E5M2"],
        ),
        (
            r#"{"recipe":"current_scaling","fp8_format":"e5m2"}"#,
            &["fp8_format", "pure E5M2"],
        ),
        (
            r#"{"recipe":"block_scaling","x_block_scaling_dim":2,"w_block_scaling_dim":2}"#,
            &[
                "x_block_scaling_dim with w_block_scaling_dim",
                "fprop",
                "at most one may be 2D",
            ],
        ),
        (
            r#"{"recipe":"custom","rules":[{"match":{},"quantizer":{"format":"fp9"}}],"default":{"format":"mxfp8"}}"#,
            &["rules[0].quantizer", "unknown variant `fp9`"],
        ),
        (
            r#"{"recipe":"custom","rules":[{"quantizer":{"format":"hybrid","rowwise":{"format":"hybrid","rowwise":{"format":"mxfp8"},"columnwise":{"format":"mxfp8"}},"columnwise":{"format":"mxfp8"}}}],"default":{"format":"mxfp8"}}"#,
            &["rules[0].quantizer.rowwise", "must not be hybrid"],
        ),
        (
            r#"{"recipe":"custom","default":{"format":"hybrid","rowwise":{"format":"mxfp8"},"columnwise":{"format":"fp8_delayed"}}}"#,
            &["default.columnwise", "inside a hybrid"],
        ),
        (
            r#"{"recipe":"custom","default":{"format":"nvfp4","block_2d":true,"rht":true}}"#,
            &["default.rht", "16x16"],
        ),
        (
            r#"{"recipe":"custom","rules":[{"match":{"name":"fc[1"},"quantizer":{"format":"mxfp8"}}],"default":{"format":"mxfp8"}}"#,
            &["rules[0].match.name", "glob"],
        ),
        (
            r#"{"recipe":"mxfp8","fp8":"e4m3"}"#,
            &["unknown field `fp8`"],
        ),
        (
            r#"{"recipe":"current_scaling","fp8_gemm_dgrad":{"use_split":false}}"#,
            &["fp8_gemm_dgrad", "unknown field `use_split`"],
        ),
        (
            r#"{"recipe":"current_scaling","fp8_gemm_wgrad":{"use_split_accumulator":"no"}}"#,
            &["fp8_gemm_wgrad.use_split_accumulator", "expected a boolean"],
        ),
        (
            r#"{"recipe":"custom","rules":[]}"#,
            &["missing field `default`"],
        ),
        (
            r#"{"recipe":"custom","default":{"format":"fp8_delayed","fp8_format":"e5m2"}}"#,
            &["default.fp8_format", "pure E5M2"],
        ),
    ];
    for (json, needles) in cases {
        let err = Recipe::from_json(json).expect_err(json).to_string();
        for needle in needles {
            assert!(
                err.contains(needle),
                "{json}\n  error: {err}\n  missing: {needle}"
            );
        }
    }
    // A recipe file error names the file too.
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.json");
    std::fs::write(&bad, r#"{"recipe":"nvfp4","disable_rht":"yes"}"#).unwrap();
    let err = Recipe::load(&bad).unwrap_err().to_string();
    assert!(
        err.contains("bad.json") && err.contains("disable_rht"),
        "{err}"
    );
}

#[test]
fn module_level_checks_give_their_errors() {
    let layout = SlotLayout::new(ModuleKind::Linear, "proj", &BoundaryRoles::default());
    // Stochastic rounding on a weight: a warning, from validation and from resolution.
    let sr_weight = Recipe::from_json(r#"{"recipe":"custom","rules":[{"match":{"tensor_type":"weight"},"quantizer":{"format":"nvfp4","stochastic_rounding":true}}],"default":{"format":"mxfp8"}}"#).unwrap();
    assert!(
        sr_weight.validate().unwrap()[0].contains("stochastic rounding on tensor type `weight`")
    );
    assert!(sr_weight.resolve(&layout).unwrap().warnings[0].contains("`weight` slot"));
    // Delayed-scaling requests of one module must agree.
    let conflict = Recipe::from_json(r#"{"recipe":"custom","rules":[{"match":{"tensor_type":"weight"},"quantizer":{"format":"fp8_delayed","margin":1}}],"default":{"format":"fp8_delayed"}}"#).unwrap();
    let err = conflict.resolve(&layout).unwrap_err().to_string();
    assert!(
        err.contains("proj forward slot 1") && err.contains("conflicts"),
        "{err}"
    );
    // No GEMM with two 128x128-block operands, wherever the rules put them.
    let two_d = Recipe::from_json(r#"{"recipe":"custom","rules":[{"match":{"tensor_type":"grad_output"},"quantizer":{"format":"fp8_block","block":"1x128"}}],"default":{"format":"fp8_block","block":"128x128"}}"#).unwrap();
    let err = two_d.resolve(&layout).unwrap_err().to_string();
    assert!(err.contains("proj GEMM 0 (fprop)"), "{err}");
    // Shapes the quantizers cannot block are caught when the module is built.
    let mxfp8 = Recipe::load(recipe_path("mxfp8.json")).unwrap();
    let q = mxfp8.resolve(&layout).unwrap();
    assert!(q.check_gemm_shapes(&layout, &[(64, 96)]).is_ok());
    let err = q
        .check_gemm_shapes(&layout, &[(64, 100)])
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("linear|weight|proj weight")
            && err.contains("K = 100")
            && err.contains("divisible by 32"),
        "{err}"
    );
    let err = q
        .check_gemm_shapes(&layout, &[(48, 96)])
        .unwrap_err()
        .to_string();
    assert!(err.contains("M = 48"), "{err}");
}

/// TE's `MMParams`: a current-scaling recipe's `fp8_gemm_*` fields reach every module's
/// quantizers (defaults: fprop fast accumulation, dgrad and wgrad the split accumulator); other
/// recipes keep TE's module defaults.
#[test]
fn fp8_gemm_accumulation_follows_the_recipe() {
    use burn_lowp::backend::GemmKind;
    use burn_lowp::recipe::SplitAccumulator;
    let te = SplitAccumulator {
        fprop: false,
        dgrad: true,
        wgrad: true,
    };
    let file = Recipe::load(recipe_path("current_scaling.json")).unwrap();
    let all_fast = Recipe::load(recipe_path("current_scaling_fast_accumulation.json")).unwrap();
    let fast_dgrad = Recipe::from_json(
        r#"{"recipe":"current_scaling","fp8_gemm_dgrad":{"use_split_accumulator":false},"fp8_gemm_fprop":{"use_split_accumulator":true}}"#,
    )
    .unwrap();
    for layout in layouts() {
        assert_eq!(file.resolve(&layout).unwrap().split_accumulator, te, "{}", layout.name);
        assert_eq!(
            all_fast.resolve(&layout).unwrap().split_accumulator,
            SplitAccumulator {
                fprop: false,
                dgrad: false,
                wgrad: false,
            },
            "{}",
            layout.name
        );
        let q = fast_dgrad.resolve(&layout).unwrap();
        assert_eq!(
            [GemmKind::Fprop, GemmKind::Dgrad, GemmKind::Wgrad].map(|k| q.split_accumulator.of(k)),
            [true, false, true],
            "{}",
            layout.name
        );
        for name in ["block_scaling.json", "delayed_scaling.json", "bf16.json"] {
            let r = Recipe::load(recipe_path(name)).unwrap();
            assert_eq!(r.resolve(&layout).unwrap().split_accumulator, te, "{name}");
        }
    }
    // The fields round-trip through the recipe's JSON.
    assert_eq!(Recipe::from_json(&fast_dgrad.to_json()).unwrap(), fast_dgrad);
    assert_eq!(GemmKind::Dgrad.split_accumulator(None), true);
    assert_eq!(GemmKind::Fprop.split_accumulator(None), false);
    assert_eq!(GemmKind::Fprop.split_accumulator(Some(true)), true);
}
