//! The MoE language model the `moe_train` example trains, on NdArray (CI): recipe rules checked
//! against the built model and the listing of every slot's quantizer, the model's size, and the
//! shipped debug configs. The driver's own tests (run config, training, resume, the command) are
//! the example's (`examples/moe_train/tests.rs`, `cargo test --example moe_train`).

mod common;

#[allow(dead_code, unused_macros, unused_imports)]
#[path = "modules/suite.rs"]
mod suite;

use std::path::Path;

use burn::backend::{Autodiff, NdArray};
use burn::module::Module;
use burn_lowp::moe::MoeLmConfig;

type AD = Autodiff<NdArray>;

use common::seeded;

/// A recipe trains what it says: a custom rule that matches none of the built model's slots is
/// an error at init naming the rule (unless the recipe allows it, then a warning), and the
/// listing shows each distinct assignment once with the modules compressed.
#[test]
fn a_recipe_rule_that_matches_nothing_is_an_error_and_the_listing_shows_every_assignment() {
    let _seeded = seeded();
    let device = Default::default();
    let config = MoeLmConfig::new().with_num_layers(2);
    let recipe = |allow: bool| {
        burn_lowp::recipe::Recipe::from_json(&format!(
            r#"{{"recipe": "custom", "allow_unmatched_rules": {allow}, "rules": [
                {{"match": {{"name": "layers.1.*"}}, "quantizer": {{"format": "identity"}}}},
                {{"match": {{"name": "layers.99.*"}}, "quantizer": {{"format": "identity"}}}},
                {{"match": {{"module_type": "dpa"}}, "quantizer": {{"format": "identity"}}}}
            ], "default": {{"format": "mxfp8"}}}}"#
        ))
        .unwrap()
    };
    let err = config.init::<AD>(&recipe(false), &device).unwrap_err().to_string();
    assert!(err.contains("rules[1].match") && err.contains("layers.99.*") && err.contains("allow_unmatched_rules"), "{err}");

    let model = config.init::<AD>(&recipe(true), &device).unwrap();
    let audit = model.recipe_audit(&recipe(true)).unwrap();
    assert_eq!(audit.unmatched_rules, vec![1, 2]);
    let listing = audit.listing();
    assert!(listing.contains("rules[1]") && listing.contains("rules[2]"), "{listing}");
    // Layer 0 and the head got the default, layer 1 the identity rule.
    let line = |tensor_type: &str, quantizer: &str, names: &str| {
        audit
            .lines
            .iter()
            .any(|l| l.tensor_type == tensor_type && l.quantizer == quantizer && burn_lowp::recipe::audit::compress_names(&l.names).contains(names))
    };
    assert!(line("weight", "mxfp8-e4m3", "layers.0.attention.qkv"), "{listing}");
    assert!(line("weight", "mxfp8-e4m3", "lm_head"), "{listing}");
    assert!(line("weight", "identity-bf16", "layers.1.attention.qkv"), "{listing}");
    assert!(!line("weight", "mxfp8-e4m3", "layers.1.attention.qkv"), "{listing}");
    // One line per distinct assignment: no (pass, module type, tensor type, quantizer) twice.
    let mut keys: Vec<_> = audit.lines.iter().map(|l| (l.pass, l.module_type.clone(), l.tensor_type.clone(), l.quantizer.clone())).collect();
    let before = keys.len();
    keys.sort();
    keys.dedup();
    assert_eq!(keys.len(), before, "{listing}");

    // A built-in recipe over two layers: each projection's weights on one line for both layers.
    let model = config.init::<AD>(&suite::recipe("current_scaling.json"), &device).unwrap();
    let listing = model.recipe_audit(&suite::recipe("current_scaling.json")).unwrap().listing();
    assert!(listing.contains("layers.[0-1].attention.qkv"), "{listing}");
}

/// Burn's `num_params` counts trainable weights only, also under delayed scaling (whose amax
/// histories are module state, not parameters): the count by hand.
#[test]
fn the_model_counts_its_trainable_weights() {
    let _seeded = seeded();
    let device = Default::default();
    let (v, h, f, e, layers) = (256, 128, 128, 4, 2);
    let config = MoeLmConfig::new()
        .with_hidden_size(h)
        .with_num_layers(layers)
        .with_ffn_hidden_size(f)
        .with_num_experts(e);
    let per_layer = h // attention RMSNorm
        + 3 * h * h + h * h // QKV, output projection
        + h // MoE RMSNorm
        + e * h // router
        + e * (2 * f * h + h * f); // SwiGLU experts: gate and up, down
    let expected = v * h + layers * per_layer + h + h * v; // embedding, final norm, head
    for name in ["bf16.json", "delayed_scaling.json"] {
        let model = config.init::<AD>(&suite::recipe(name), &device).unwrap();
        assert_eq!(model.num_params(), expected, "{name}");
    }
    let tied = config.clone().with_tie_embeddings(true).init::<AD>(&suite::recipe("bf16.json"), &device).unwrap();
    assert_eq!(tied.num_params(), expected - h * v);
}

/// The shipped debug configs load, and `moe-same-iteration.json` is `moe.json` with AutoswitchGemm
/// deciding in the same iteration (the README measures one against the other).
#[test]
fn the_shipped_debug_configs_differ_only_in_switch_timing() {
    use burn_lowp::debug::config::SwitchTiming;
    use burn_lowp::debug::DebugConfig;
    let dir = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/configs/debug"));
    let next = DebugConfig::load(dir.join("moe.json")).unwrap();
    let mut same = DebugConfig::load(dir.join("moe-same-iteration.json")).unwrap();
    let timings = |c: &DebugConfig| -> Vec<SwitchTiming> {
        c.sections.values().filter_map(|s| s.features.autoswitch_gemm.as_ref().map(|a| a.timing)).collect()
    };
    assert_eq!(timings(&next), vec![SwitchTiming::NextSample; 2]);
    assert_eq!(timings(&same), vec![SwitchTiming::SameIteration; 2]);
    for section in same.sections.values_mut() {
        if let Some(a) = section.features.autoswitch_gemm.as_mut() {
            a.timing = SwitchTiming::NextSample;
        }
    }
    assert_eq!(same, next);
}
