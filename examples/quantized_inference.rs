//! A burn-lowp layer's weights exported quantized and run by a plain Burn inference program.
//!
//! ```text
//! cargo run --release --example quantized_inference --features cuda [-- OUT_DIR]
//! ```
//!
//! The first half is the training side: a burn-lowp `Linear` under a recipe (here with its
//! initial weights; a trained model exports the same way) gives its weight quantized as a Burn
//! `QFloat` tensor in a `burn::nn::Linear` record, saved with Burn's recorder next to the
//! layer's config. The second half, `plain_burn_inference`, uses nothing but Burn's API: it loads
//! the config and the record, builds `burn::nn::Linear` on CUDA and runs it. Burn 0.21 stores FP8
//! quantized tensors on CUDA only; the recipe's weights are FP8 128x128 blocks (MXFP8 records
//! load too, but Burn's UE8M0 dequantize does not compile on sm_90; NVFP4 does not export).

use std::path::{Path, PathBuf};

use burn::backend::cuda::CudaDevice;
use burn::backend::{Cuda, NdArray};
use burn::config::Config;
use burn::module::Module;
use burn::nn::{Linear, LinearConfig, LinearRecord};
use burn::record::{FullPrecisionSettings, NamedMpkFileRecorder, Recorder};
use burn::tensor::{Distribution, Tensor};

/// Training side: export a burn-lowp layer's weights, quantized, as a burn-nn Linear.
fn export(dir: &Path) -> Result<burn_lowp::nn::QuantizedLinearExport, Box<dyn std::error::Error>> {
    let recipe = burn_lowp::recipe::Recipe::from_json(
        r#"{"recipe": "block_scaling", "w_block_scaling_dim": 2}"#,
    )?;
    let layer = burn_lowp::nn::LinearConfig::new(1024, 512)
        .init::<NdArray>(&recipe, &Default::default())?;
    let export = layer.export_quantized()?;
    let recorder = NamedMpkFileRecorder::<FullPrecisionSettings>::new();
    Recorder::<NdArray>::record(&recorder, export.record.clone(), dir.join("fc"))?;
    export.config.save(dir.join("fc.json"))?;
    println!(
        "exported {} weight [{}, {}] to {}",
        export.format.name(),
        export.config.d_input,
        export.config.d_output,
        dir.display()
    );
    Ok(export)
}

/// Inference side: plain Burn.
fn plain_burn_inference(
    dir: &Path,
    device: &CudaDevice,
) -> Result<Linear<Cuda>, Box<dyn std::error::Error>> {
    let config = LinearConfig::load(dir.join("fc.json"))?;
    let record: LinearRecord<Cuda> =
        NamedMpkFileRecorder::<FullPrecisionSettings>::new().load(dir.join("fc"), device)?;
    Ok(config.init::<Cuda>(device).load_record(record))
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = std::env::args()
        .nth(1)
        .map(PathBuf::from)
        .unwrap_or_else(|| std::env::temp_dir().join("lowp_quantized_inference"));
    std::fs::create_dir_all(&dir)?;
    let export = export(&dir)?;

    let device = CudaDevice::default();
    let linear = plain_burn_inference(&dir, &device)?;
    println!("loaded weight dtype {:?}", linear.weight.val().dtype());
    let x = Tensor::<Cuda, 2>::random(
        [8, export.config.d_input],
        Distribution::Normal(0.0, 1.0),
        &device,
    );
    let y = linear.forward(x.clone());

    // burn-lowp's dequantize-then-matmul reference: the same arithmetic, so the same bits.
    let w = Tensor::<Cuda, 2>::from_data(export.dequantized_weight()?, &device);
    let b = Tensor::<Cuda, 1>::from_data(export.record.bias.clone().expect("bias"), &device);
    let reference = x.matmul(w) + b.unsqueeze::<2>();
    let (y, reference) = (
        y.into_data().to_vec::<f32>()?,
        reference.into_data().to_vec::<f32>()?,
    );
    let differing = y
        .iter()
        .zip(&reference)
        .filter(|(a, b)| a.to_bits() != b.to_bits())
        .count();
    println!(
        "forward [8, {}]: {differing} of {} outputs differ from the reference in any bit",
        export.config.d_output,
        y.len()
    );
    if differing > 0 {
        return Err(
            "plain Burn's forward differs from the dequantize-then-matmul reference".into(),
        );
    }
    Ok(())
}
