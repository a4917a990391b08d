//! The module test suite, written once and instantiated per backend by `module_suite!` (the
//! checks are in `gemm.rs` and `linear.rs`), and what the module tests share: the recipe files,
//! how exact a backend's results are, and comparisons of results.
#![allow(dead_code)]

use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorPrimitive};
use burn_lowp::backend::LowpBackend;
use burn_lowp::format::{HostMatrix, InputDtype};
use burn_lowp::recipe::Recipe;

/// What a backend's results are compared with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exactness {
    /// NdArray: the f32 reference path. The identity recipe equals plain Burn bit for bit.
    Reference,
    /// CUDA: cuBLASLt GEMMs, whose summation order differs from Burn's matmul, which may itself
    /// use TF32 tensor cores, and the `bf16` recipe really rounds operands to BF16 there (RMS
    /// relative error of a product about 1.6e-3); identity results are compared within 8e-3
    /// relative (Frobenius) error.
    Gpu,
}

pub fn recipe(name: &str) -> Recipe {
    Recipe::load(crate::common::recipes_dir().join(name)).unwrap()
}

pub const RECIPES: [&str; 8] = [
    "bf16.json",
    "delayed_scaling.json",
    "current_scaling.json",
    "block_scaling.json",
    "mxfp8.json",
    "nvfp4.json",
    "mxfp8_fwd_nvfp4_bwd.json",
    "nvfp4_keep_first_last_bf16.json",
];

pub(crate) fn matrix(rows: usize, cols: usize, seed: u64) -> HostMatrix {
    let mut m = crate::common::random_matrix(rows, cols, seed, 1.0);
    m.dtype = InputDtype::F32;
    m
}

pub(crate) fn f32_tensor<B: LowpBackend, const D: usize>(
    t: burn::tensor::ops::FloatTensor<B>,
) -> Tensor<B, D> {
    Tensor::from_primitive(TensorPrimitive::Float(t))
}

pub(crate) fn values<BB: Backend, const D: usize>(t: Tensor<BB, D>) -> Vec<f32> {
    t.into_data().convert::<f32>().into_vec::<f32>().unwrap()
}

pub(crate) fn relative_error(got: &[f32], want: &[f32]) -> f64 {
    let err: f64 = got
        .iter()
        .zip(want)
        .map(|(g, w)| (*g as f64 - *w as f64).powi(2))
        .sum::<f64>();
    let norm: f64 = want.iter().map(|w| (*w as f64).powi(2)).sum::<f64>();
    (err / norm).sqrt()
}

pub(crate) fn assert_same(got: Vec<f32>, want: Vec<f32>, exactness: Exactness, what: &str) {
    match exactness {
        Exactness::Reference => assert_eq!(got, want, "{what}"),
        Exactness::Gpu => {
            let e = relative_error(&got, &want);
            assert!(e <= 8e-3, "{what}: relative error {e}");
        }
    }
}

macro_rules! module_suite {
    ($backend:ty, $device:expr, $exactness:expr) => {
        #[test]
        fn gemms_match_an_f64_reference_within_format_bounds() {
            if let Some(d) = $device {
                crate::gemm::check_gemms::<$backend>(&d, $exactness);
            }
        }

        #[test]
        fn identity_recipe_matches_plain_burn() {
            if let Some(d) = $device {
                crate::linear::check_identity_recipe_matches_plain_burn::<$backend>(&d, $exactness);
            }
        }

        #[test]
        fn gradients_match_a_high_precision_reference() {
            if let Some(d) = $device {
                crate::linear::check_gradients::<$backend>(&d, $exactness);
            }
        }

        #[test]
        fn bias_gradient_sums_the_output_gradient_over_rows() {
            if let Some(d) = $device {
                crate::linear::check_bias_gradient::<$backend>(&d);
            }
        }

        #[test]
        fn layernorm_gradients_match_plain_burn() {
            if let Some(d) = $device {
                crate::linear::check_layernorm_gradients::<$backend>(&d);
            }
        }

        #[test]
        fn a_small_mlp_learns_under_every_recipe_file() {
            if let Some(d) = $device {
                crate::linear::check_mlp_learns_under_every_recipe::<$backend>(&d);
            }
        }

        #[test]
        fn num_params_counts_trainable_weights_only() {
            if let Some(d) = $device {
                crate::linear::check_num_params_counts_weights_only::<$backend>(&d);
            }
        }

        #[test]
        fn cached_weights_are_reused_until_the_weight_changes() {
            if let Some(d) = $device {
                crate::linear::check_weight_cache::<$backend>(&d);
            }
        }

        #[test]
        fn layernorm_linear_normalizes_like_the_formula() {
            if let Some(d) = $device {
                crate::linear::check_layernorm_linear::<$backend>(&d);
            }
        }
    };
}
pub(crate) use module_suite;

