//! A burn-lowp module's weights exported, quantized, as plain `burn::nn::Linear` records
//! (`nn::quantized_export`).
//!
//! On the host (NdArray, CI): under FP8 current scaling, FP8 block scaling (128x128 and 1x128
//! weights) and MXFP8 (1D and 2D), the exported weight is a Burn `QFloat` `[in, out]` tensor
//! holding the reference quantizer's columnwise codes and scales byte for byte, dequantizing (by
//! Burn's rule) to the forward GEMM's weight values wherever the module docs say so; it survives
//! Burn's file recorders (named MessagePack and bincode) byte for byte; the record's file format
//! is `burn::nn::LinearRecord`'s (each loads the other's files); what Burn cannot hold is an error.
//!
//! On CUDA (`cuda` module): a plain Burn program loads the saved file as `burn::nn::Linear` with
//! nothing but Burn's API, and its forward equals the dequantize-then-matmul reference bit for bit.

mod common;

use burn::backend::NdArray;
use burn::module::Module;
use burn::nn::{LinearConfig as BurnLinearConfig, LinearRecord};
use burn::record::{BinFileRecorder, FullPrecisionSettings, NamedMpkFileRecorder, Recorder};
use burn::tensor::{DType, TensorData};
use burn_lowp::backend::quantized::burn_native::from_burn_data;
use burn_lowp::format::matrix::transpose;
use burn_lowp::format::{
    quantize, Direction, HostMatrix, HostQuantized, InputDtype, QuantFormat, QuantizedData, Usage,
};
use burn_lowp::nn::{LayerNormMlpConfig, LinearConfig, LinearRecordData, QuantizedLinearExport};
use burn_lowp::ops::Activation;
use burn_lowp::quant::QuantizerSpec;
use burn_lowp::recipe::Recipe;

const IN: usize = 256;
const OUT: usize = 384;

/// The recipes whose weights export, with whether the exported values are the forward GEMM's.
fn recipes() -> Vec<(&'static str, bool)> {
    vec![
        (r#"{"recipe": "current_scaling"}"#, true),
        (
            r#"{"recipe": "block_scaling", "w_block_scaling_dim": 2}"#,
            true,
        ),
        (
            r#"{"recipe": "block_scaling", "w_block_scaling_dim": 1, "x_block_scaling_dim": 1}"#,
            false,
        ),
        (
            r#"{"recipe": "mxfp8", "enable_2d_quantization": true}"#,
            true,
        ),
        (r#"{"recipe": "mxfp8"}"#, false),
    ]
}

/// A burn-lowp `Linear` under `recipe` with its (random) weights on NdArray.
fn module(recipe: &str) -> burn_lowp::nn::Linear<NdArray> {
    let recipe = Recipe::from_json(recipe).unwrap();
    LinearConfig::new(IN, OUT)
        .init::<NdArray>(&recipe, &Default::default())
        .unwrap()
}

fn f32s(data: TensorData) -> Vec<f32> {
    data.convert::<f32>().into_vec::<f32>().unwrap()
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// The reference quantization of the module's weight under its own forward weight quantizer.
fn reference(linear: &burn_lowp::nn::Linear<NdArray>, spec: &QuantizerSpec) -> HostQuantized {
    let w = f32s(linear.weight.val().into_data());
    let m = HostMatrix::new("w", OUT, IN, InputDtype::F32, w).unwrap();
    quantize(&m, &spec.format_config(None).unwrap(), Usage::BOTH).unwrap()
}

fn weight_spec(linear: &burn_lowp::nn::Linear<NdArray>) -> QuantizerSpec {
    let slot = linear.lowp.layout.gemms()[0].weight;
    linear.lowp.quantizers.forward[slot].spec.clone()
}

/// The exported weight holds the reference's columnwise codes and scales (MXFP8: moved into the
/// `[in, out]` transpose) and dequantizes to the transposed columnwise values; to the forward's
/// (rowwise) values too where `forward_values`.
fn check_export(
    what: &str,
    export: &QuantizedLinearExport,
    q: &HostQuantized,
    forward_values: bool,
) {
    let weight = &export.record.weight;
    assert!(
        matches!(weight.dtype, DType::QFloat(_)),
        "{what}: {:?}",
        weight.dtype
    );
    assert_eq!(
        weight.shape.as_slice(),
        &[IN, OUT],
        "{what}: burn-nn's [in, out]"
    );
    let (format, data) = from_burn_data(weight).unwrap();
    let col = q.data(Direction::Columnwise).unwrap();
    match q.format {
        QuantFormat::Mxfp8 { .. } => {
            assert_eq!(data.codes, transpose(&col.codes, OUT, IN), "{what}: codes");
        }
        _ => {
            assert_eq!(format, q.format, "{what}");
            assert_eq!(
                data,
                QuantizedData {
                    amax: None,
                    ..col.clone()
                },
                "{what}: columnwise storage"
            );
        }
    }
    let deq = f32s(export.dequantized_weight().unwrap());
    let logical = |d| transpose(&q.dequantize(d).unwrap(), OUT, IN);
    assert_eq!(
        bits(&deq),
        bits(&logical(Direction::Columnwise)),
        "{what}: columnwise values"
    );
    if forward_values {
        assert_eq!(
            bits(&deq),
            bits(&logical(Direction::Rowwise)),
            "{what}: the forward GEMM's values"
        );
    }
    assert_eq!(export.config.d_input, IN);
    assert_eq!(export.config.d_output, OUT);
    assert!(export.config.bias);
}

#[test]
fn exported_weights_hold_the_reference_quantization() {
    for (recipe, forward_values) in recipes() {
        let linear = module(recipe);
        let q = reference(&linear, &weight_spec(&linear));
        let export = linear.export_quantized().unwrap();
        check_export(recipe, &export, &q, forward_values);
        let bias = f32s(export.record.bias.clone().unwrap());
        assert_eq!(
            bits(&bias),
            bits(&f32s(linear.bias.as_ref().unwrap().val().into_data())),
            "{recipe}: bias"
        );
    }
}

/// The record through a file recorder and back, byte for byte.
fn through<R: Recorder<NdArray, RecordArgs = std::path::PathBuf, LoadArgs = std::path::PathBuf>>(
    recorder: R,
    record: LinearRecordData,
    path: std::path::PathBuf,
) -> LinearRecordData {
    recorder.record(record, path.clone()).unwrap();
    recorder.load(path, &Default::default()).unwrap()
}

#[test]
fn exported_records_survive_burns_recorders_byte_for_byte() {
    let dir = tempfile::tempdir().unwrap();
    for (i, (recipe, _)) in recipes().into_iter().enumerate() {
        let linear = module(recipe);
        let export = linear.export_quantized().unwrap();
        let expected = from_burn_data(&export.record.weight).unwrap();
        for (name, loaded) in [
            (
                "named mpk",
                through(
                    NamedMpkFileRecorder::<FullPrecisionSettings>::new(),
                    export.record.clone(),
                    dir.path().join(format!("m{i}")),
                ),
            ),
            (
                "bin",
                through(
                    BinFileRecorder::<FullPrecisionSettings>::new(),
                    export.record.clone(),
                    dir.path().join(format!("b{i}")),
                ),
            ),
        ] {
            let what = format!("{recipe} {name}");
            assert_eq!(loaded.weight.dtype, export.record.weight.dtype, "{what}");
            assert_eq!(loaded.weight.shape, export.record.weight.shape, "{what}");
            assert_eq!(
                loaded.weight.bytes.to_vec(),
                export.record.weight.bytes.to_vec(),
                "{what}: weight bytes"
            );
            assert_eq!(
                from_burn_data(&loaded.weight).unwrap(),
                expected,
                "{what}: storage"
            );
            assert_eq!(
                loaded.bias.unwrap().bytes.to_vec(),
                export.record.bias.clone().unwrap().bytes.to_vec(),
                "{what}: bias"
            );
            assert_eq!(loaded.weight_id, export.record.weight_id, "{what}");
        }
    }
}

#[test]
fn the_record_format_is_burn_nn_linears() {
    let dir = tempfile::tempdir().unwrap();
    let device = Default::default();
    let recorder = NamedMpkFileRecorder::<FullPrecisionSettings>::new();
    // A burn-nn Linear saved by Burn loads as our record...
    let burn_linear = BurnLinearConfig::new(IN, OUT).init::<NdArray>(&device);
    // (Read before the record takes the module: a lazily initialized parameter's clone draws anew.)
    let weight = f32s(burn_linear.weight.val().into_data());
    let bias = f32s(burn_linear.bias.as_ref().unwrap().val().into_data());
    let path = dir.path().join("burn");
    Recorder::<NdArray>::record(&recorder, burn_linear.into_record(), path.clone()).unwrap();
    let ours: LinearRecordData = Recorder::<NdArray>::load(&recorder, path, &device).unwrap();
    assert_eq!(f32s(ours.weight.clone()), weight);
    assert_eq!(f32s(ours.bias.clone().unwrap()), bias);
    // ... and ours (here with a float weight, which NdArray can hold) loads as burn-nn's.
    let mut ours = ours;
    ours.weight = TensorData::new(
        (0..IN * OUT).map(|i| i as f32 * 0.5).collect::<Vec<_>>(),
        [IN, OUT],
    );
    let path = dir.path().join("ours");
    Recorder::<NdArray>::record(&recorder, ours.clone(), path.clone()).unwrap();
    let record: LinearRecord<NdArray> =
        Recorder::<NdArray>::load(&recorder, path, &device).unwrap();
    let loaded = BurnLinearConfig::new(IN, OUT)
        .init::<NdArray>(&device)
        .load_record(record);
    assert_eq!(
        f32s(loaded.weight.val().into_data()),
        f32s(ours.weight.clone())
    );
    assert_eq!(
        f32s(loaded.bias.clone().unwrap().val().into_data()),
        f32s(ours.bias.clone().unwrap())
    );
    // `into_burn_record` builds the same record in process.
    let direct = ours.into_burn_record::<NdArray>(&device).unwrap();
    let direct = BurnLinearConfig::new(IN, OUT)
        .init::<NdArray>(&device)
        .load_record(direct);
    assert_eq!(
        f32s(direct.weight.val().into_data()),
        f32s(loaded.weight.val().into_data())
    );
}

#[test]
fn layernorm_mlp_exports_both_linears() {
    let recipe = Recipe::from_json(r#"{"recipe": "block_scaling"}"#).unwrap();
    let mlp = LayerNormMlpConfig::new(IN, OUT)
        .with_activation(Activation::Gelu)
        .init::<NdArray>(&recipe, &Default::default())
        .unwrap();
    let (fc1, fc2) = mlp.export_quantized().unwrap();
    assert_eq!(fc1.record.weight.shape.as_slice(), &[IN, OUT]);
    assert_eq!(fc2.record.weight.shape.as_slice(), &[OUT, IN]);
    assert!(matches!(fc1.record.weight.dtype, DType::QFloat(_)));
    assert!(matches!(fc2.record.weight.dtype, DType::QFloat(_)));
}

#[test]
fn what_burn_cannot_hold_is_an_error() {
    let err = module(r#"{"recipe": "nvfp4"}"#)
        .export_quantized()
        .unwrap_err()
        .to_string();
    assert!(err.contains("nvfp4") && err.contains("NVFP4"), "{err}");
    let err = module(r#"{"recipe": "delayed_scaling"}"#)
        .export_quantized()
        .unwrap_err()
        .to_string();
    assert!(err.contains("delayed"), "{err}");
    // NdArray cannot store FP8 QFloat tensors: building the burn-nn record there says so.
    let export = module(r#"{"recipe": "current_scaling"}"#)
        .export_quantized()
        .unwrap();
    let Err(err) = export
        .record
        .into_burn_record::<NdArray>(&Default::default())
    else {
        panic!("NdArray built an FP8 QFloat record")
    };
    let err = err.to_string();
    assert!(err.contains("cannot store"), "{err}");
}

/// A plain Burn program on CUDA: the saved file loads as `burn::nn::Linear` through Burn's API
/// alone, and its forward is the dequantize-then-matmul reference bit for bit.
#[cfg(feature = "cuda")]
mod cuda {
    use burn::module::Module;
    use burn::nn::{Linear, LinearConfig, LinearRecord};
    use burn::record::{FullPrecisionSettings, NamedMpkFileRecorder, Recorder};
    use burn::tensor::quantization::QuantParam;
    use burn::tensor::{DType, Distribution, Tensor};

    use burn_cubecl::CubeBackend;
    use burn_lowp_kernels::cubecl::cuda::CudaRuntime;

    use super::*;

    type Cuda = CubeBackend<CudaRuntime, f32, i32, u8>;

    /// What the inference program does: nothing here is burn-lowp.
    fn load_plain_burn(
        config: &LinearConfig,
        path: std::path::PathBuf,
        device: &burn_lowp_kernels::cubecl::cuda::CudaDevice,
    ) -> Linear<Cuda> {
        let record: LinearRecord<Cuda> = NamedMpkFileRecorder::<FullPrecisionSettings>::new()
            .load(path, device)
            .expect("Burn loads the exported record");
        config.init::<Cuda>(device).load_record(record)
    }

    #[test]
    fn plain_burn_loads_the_export_and_matches_the_reference_forward() {
        let Some(device) = crate::common::cuda_device() else {
            return;
        };
        let dir = tempfile::tempdir().unwrap();
        for (i, (recipe, _)) in recipes().into_iter().enumerate() {
            let export = module(recipe).export_quantized().unwrap();
            let path = dir.path().join(format!("linear{i}"));
            let recorder = NamedMpkFileRecorder::<FullPrecisionSettings>::new();
            Recorder::<Cuda>::record(&recorder, export.record.clone(), path.clone()).unwrap();
            let linear = load_plain_burn(&export.config, path, &device);
            let weight = linear.weight.val();
            let DType::QFloat(scheme) = weight.dtype() else {
                panic!(
                    "{recipe}: the loaded weight is {:?}, not QFloat",
                    weight.dtype()
                )
            };
            // The weight on the GPU holds the exported bytes.
            assert_eq!(
                weight.clone().into_data().bytes.to_vec(),
                export.record.weight.bytes.to_vec(),
                "{recipe}"
            );
            // Burn 0.21's CUDA dequantize of UE8M0 params (MXFP8) does not compile on sm_90
            // (NVRTC: `__nv_cvt_e8m0_to_bf162raw` undefined; see tests/burn_native.rs): those
            // records are checked loaded, not run.
            if scheme.param == QuantParam::UE8M0 {
                continue;
            }
            let x = Tensor::<Cuda, 2>::random([64, IN], Distribution::Normal(0.0, 1.0), &device);
            let y = linear.forward(x.clone());
            let w = Tensor::<Cuda, 2>::from_data(export.dequantized_weight().unwrap(), &device);
            let b = Tensor::<Cuda, 1>::from_data(export.record.bias.clone().unwrap(), &device);
            let reference = x.matmul(w) + b.unsqueeze::<2>();
            let (y, reference) = (f32s(y.into_data()), f32s(reference.into_data()));
            assert_eq!(
                bits(&y),
                bits(&reference),
                "{recipe}: Burn's forward against dequantize-then-matmul"
            );
        }
    }
}
