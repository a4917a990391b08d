//! A crate that uses burn-lowp as a user's crate does: a path dependency, its own workspace, so
//! the repository's `[patch.crates-io]` (vendor/) does not apply and CubeCL is the published
//! 0.10.0. It trains a `LayerNormMlp` a few steps under the FP8 current-scaling recipe and checks
//! the backend's FP8 codes against the reference quantizer (`burn_lowp::format`), overflow
//! included (1e4 with scale 1 must give E4M3's saturated code 0x7E, not NaN). Exits non-zero on
//! a mismatch or a loss that is not finite.
//!
//!   cargo run                    # NdArray (CPU)
//!   cargo run --features cuda    # CUDA GPU 0 (published CubeCL: device flags, probed FP8 cast)

use std::process::ExitCode;

use burn::backend::Autodiff;
use burn::optim::{AdamConfig, GradientsParams, Optimizer};
use burn::tensor::{Distribution, ElementConversion, Tensor};
use burn_lowp::backend::ops::{BytesOps, QuantizeOps};
use burn_lowp::backend::ScaleColumns;
use burn_lowp::format::{quantize_fp8_with_scale, Direction, Fp8Format, HostMatrix, InputDtype, Usage};
use burn_lowp::nn::LayerNormMlpConfig;
use burn_lowp::recipe::Recipe;
use burn_lowp::LowpError;

#[cfg(feature = "cuda")]
type B = burn::backend::Cuda<f32, i32>;
#[cfg(not(feature = "cuda"))]
type B = burn::backend::NdArray<f32>;

fn main() -> ExitCode {
    match run() {
        Ok(()) => {
            println!("downstream: OK");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("downstream: FAILED: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<(), String> {
    #[cfg(feature = "cuda")]
    let device = {
        println!("{}", burn_lowp::backend::cuda::active_paths(0));
        burn::backend::cuda::CudaDevice::new(0)
    };
    #[cfg(not(feature = "cuda"))]
    let device = burn::backend::ndarray::NdArrayDevice::Cpu;
    check_codes(&device)?;
    train(&device)
}

/// A few Adam steps of one LayerNormMlp under FP8 current scaling: the loss must stay finite.
fn train(device: &burn::tensor::Device<B>) -> Result<(), String> {
    // The repository's recipes; `recipes/` of the working directory where the binary was moved.
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../recipes");
    let dir = if dir.is_dir() { dir } else { "recipes".into() };
    let recipe = Recipe::load(dir.join("current_scaling.json")).map_err(err)?;
    let mut mlp = LayerNormMlpConfig::new(128, 256)
        .with_name("mlp".into())
        .init::<Autodiff<B>>(&recipe, device)
        .map_err(err)?;
    let teacher = Tensor::<B, 2>::random([128, 128], Distribution::Normal(0.0, 0.1), device);
    let mut optim = AdamConfig::new().init();
    let mut losses = Vec::new();
    for _ in 0..5 {
        let x = Tensor::<B, 2>::random([64, 128], Distribution::Normal(0.0, 1.0), device);
        let target = Tensor::<Autodiff<B>, 2>::from_inner(x.clone().matmul(teacher.clone()).tanh());
        let (y, _) = mlp.forward(Tensor::from_inner(x)).map_err(err)?;
        let loss = (y - target).powi_scalar(2).mean();
        losses.push(loss.clone().into_scalar().elem::<f32>());
        let grads = GradientsParams::from_grads(loss.backward(), &mlp);
        mlp.end_step().map_err(err)?;
        mlp = optim.step(1e-3, mlp, grads);
    }
    println!("train: LayerNormMlp 128x256, current scaling, loss {losses:.4?}");
    match losses.iter().all(|l| l.is_finite()) {
        true => Ok(()),
        false => Err(format!("non-finite loss: {losses:?}")),
    }
}

/// FP8 codes of the backend's fixed-scale cast (delayed scaling's) against the reference, for
/// both formats and scales that push values past each format's largest finite value.
fn check_codes(device: &burn::tensor::Device<B>) -> Result<(), String> {
    let specials = [0.0f32, -0.0, 1.0, -3.5, 0.3, 447.9, 448.0, 464.0, 500.0, 1.0e4, -1.0e4, 6.0e4, 1.0e6, 1.0e-3, 1.0e-9];
    let (rows, cols) = (16, 128);
    let values: Vec<f32> = (0..rows * cols)
        .map(|i| match i % 4 {
            0 => specials[(i / 4) % specials.len()],
            k => ((i * 7919 % 1000) as f32 - 500.0) * 0.37 * k as f32,
        })
        .collect();
    let x = HostMatrix::new("x", rows, cols, InputDtype::F32, values).map_err(err)?;
    let mut checked = 0;
    for fp8 in [Fp8Format::E4M3, Fp8Format::E5M2] {
        for scale in [1.0f32, 4.0] {
            let reference = quantize_fp8_with_scale(&x, fp8, scale, Usage::ROWWISE).map_err(err)?;
            let scale_tensor =
                B::bytes_float_from_host(&HostMatrix::new("scale", 1, 1, InputDtype::F32, vec![scale]).map_err(err)?, device);
            let ours = B::quantize_fp8_with_scale(
                B::bytes_float_from_host(&x, device),
                fp8,
                ScaleColumns::whole(scale_tensor),
                Usage::ROWWISE,
                None,
            )
            .map_err(err)?
            .to_host()
            .map_err(err)?;
            let (got, want) = match (ours.data(Direction::Rowwise), reference.data(Direction::Rowwise)) {
                (Some(g), Some(w)) => (&g.codes, &w.codes),
                _ => return Err("no rowwise codes".into()),
            };
            let differ = got.iter().zip(want).filter(|(a, b)| a != b).count();
            if differ > 0 || got.len() != want.len() {
                let first = got.iter().zip(want).position(|(a, b)| a != b).unwrap_or(0);
                return Err(format!(
                    "{fp8:?} scale {scale}: {differ} of {} codes differ from the reference; first at {first}: \
                     x = {}, got {:#04x}, want {:#04x}",
                    want.len(),
                    x.values[first],
                    got.get(first).copied().unwrap_or(0),
                    want[first],
                ));
            }
            // The overflow case spelled out: 1e4 is element 36 (specials[9] at i = 4 * 9).
            if fp8 == Fp8Format::E4M3 && scale == 1.0 && got[36] != 0x7E {
                return Err(format!("1e4 to E4M3 gave {:#04x}, not the saturated 0x7e", got[36]));
            }
            checked += got.len();
        }
    }
    println!("codes: {checked} FP8 codes (E4M3, E5M2; overflow included) equal the reference");
    Ok(())
}

fn err(e: LowpError) -> String {
    e.to_string()
}
