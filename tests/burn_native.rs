//! Our quantized storages as Burn's native quantized tensors (`backend::quantized::burn_native`).
//!
//! On the host: the `TensorData` a storage converts to holds the reference quantizer's codes and
//! `scale_inv` bytes under the scheme stated here; decoding it as Burn's dequantize does (code
//! times the param `params_shape` assigns to its block) gives the reference dequantize bit for
//! bit; the round trip back is byte-exact; what Burn 0.21 cannot hold is an error. NdArray cannot
//! hold FP8 `QFloat` tensors (its `q_from_data` panics on them), so there the device conversion
//! must answer an error. Burn's own dequantize kernel runs in the `cuda` module (GPU only).

mod common;

use burn::tensor::quantization::{
    params_shape, BlockSize, QuantLevel, QuantMode, QuantParam, QuantScheme, QuantStore, QuantValue,
};
use burn::tensor::{DType, TensorData};
use burn_lowp::backend::quantized::burn_native::{burn_scheme, from_burn_data, to_burn_data};
use burn_lowp::format::codec::e8m0_to_f32;
use burn_lowp::format::matrix::transpose;
use burn_lowp::format::{
    quantize_fp8_block, quantize_fp8_current, quantize_mxfp8, quantize_nvfp4, BlockShape,
    Direction, Fp8BlockScaling, Fp8CurrentScaling, Fp8Format, HostQuantized, Mxfp8Config,
    Nvfp4Config, QuantFormat, QuantizedData, Scales, Usage,
};

const DIRECTIONS: [Direction; 2] = [Direction::Rowwise, Direction::Columnwise];

fn scheme(value: QuantValue, level: QuantLevel, param: QuantParam) -> QuantScheme {
    QuantScheme {
        value,
        param,
        store: QuantStore::Native,
        level,
        mode: QuantMode::Symmetric,
    }
}

/// Every storage that converts, with the Burn scheme it must convert to.
fn convertible() -> Vec<(HostQuantized, Direction, QuantScheme)> {
    let x = common::random_matrix(256, 384, 7, 6.0);
    let mut cases = Vec::new();
    for (fp8, value) in [
        (Fp8Format::E4M3, QuantValue::E4M3),
        (Fp8Format::E5M2, QuantValue::E5M2),
    ] {
        let q = quantize_fp8_current(&x, &Fp8CurrentScaling::new(fp8), Usage::BOTH).unwrap();
        for d in DIRECTIONS {
            cases.push((
                q.clone(),
                d,
                scheme(value, QuantLevel::Tensor, QuantParam::F32),
            ));
        }
        for (block, size) in [
            (BlockShape::OneByOneTwentyEight, [1u8, 128]),
            (BlockShape::OneTwentyEightSquare, [128u8, 128]),
        ] {
            let mut config = Fp8BlockScaling::new(fp8, block);
            // Non-power-of-two scales too: the f32 params carry any value.
            for pow2 in [true, false] {
                config.pow2_scales = pow2;
                let q = quantize_fp8_block(&x, &config, Usage::BOTH).unwrap();
                for d in DIRECTIONS {
                    let level = QuantLevel::Block(BlockSize::new(size));
                    cases.push((q.clone(), d, scheme(value, level, QuantParam::F32)));
                }
            }
        }
        for block_2d in [false, true] {
            let q = quantize_mxfp8(&x, &Mxfp8Config { fp8, block_2d }, Usage::ROWWISE).unwrap();
            let level = QuantLevel::Block(BlockSize::new([1u8, 32]));
            cases.push((
                q,
                Direction::Rowwise,
                scheme(value, level, QuantParam::UE8M0),
            ));
        }
    }
    cases
}

/// The reference dequantize of one storage, in its codes' layout (FP8 columnwise: `[K, M]`).
fn reference_in_storage_layout(q: &HostQuantized, d: Direction) -> Vec<f32> {
    let logical = q.dequantize(d).unwrap();
    match (q.format, d) {
        (QuantFormat::Mxfp8 { .. }, _) | (_, Direction::Rowwise) => logical,
        (_, Direction::Columnwise) => transpose(&logical, q.rows, q.cols),
    }
}

/// Decodes Burn native quantized data the way Burn's dequantize does: `param * value`, the param
/// of the block `params_shape` gives the element, F32 params as f32 and UE8M0 as `2^(e - 127)`.
fn burn_semantics_dequantize(data: &TensorData) -> Vec<f32> {
    let DType::QFloat(scheme) = data.dtype else {
        panic!("not QFloat")
    };
    let fp8 = match scheme.value {
        QuantValue::E4M3 => Fp8Format::E4M3,
        QuantValue::E5M2 => Fp8Format::E5M2,
        v => panic!("{v:?}"),
    };
    let [rows, cols] = [data.shape[0], data.shape[1]];
    let pshape = params_shape(&data.shape, scheme.level);
    let nparams = pshape.num_elements();
    // Per-tensor params have shape [1]: one block covering the matrix.
    let pcols = if pshape.num_dims() == 2 { pshape[1] } else { 1 };
    let bytes: &[u8] = &data.bytes;
    let block = match scheme.level {
        QuantLevel::Tensor => vec![rows, cols],
        QuantLevel::Block(b) => b.to_dim_vec(2).iter().map(|&v| v as usize).collect(),
    };
    let param = |i: usize| -> f32 {
        match scheme.param {
            QuantParam::F32 => {
                let at = bytes.len() - 4 * nparams + 4 * i;
                f32::from_le_bytes(bytes[at..at + 4].try_into().unwrap())
            }
            QuantParam::UE8M0 => e8m0_to_f32(bytes[bytes.len() - nparams + i]),
            p => panic!("{p:?}"),
        }
    };
    let mut out = Vec::with_capacity(rows * cols);
    for r in 0..rows {
        for c in 0..cols {
            let p = param((r / block[0]) * pcols + c / block[1]);
            out.push(fp8.decode(bytes[r * cols + c]) * p);
        }
    }
    out
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

#[test]
fn storages_convert_to_the_stated_scheme_with_reference_bytes() {
    for (q, d, expected_scheme) in convertible() {
        let what = format!("{} {}", q.format.name(), d.name());
        let data = q.data(d).unwrap();
        assert_eq!(burn_scheme(q.format, d).unwrap(), expected_scheme, "{what}");
        let burn = to_burn_data(q.format, d, data).unwrap();
        assert_eq!(burn.dtype, DType::QFloat(expected_scheme), "{what}");
        assert_eq!(burn.shape.as_slice(), &data.codes_shape[..], "{what}");
        let bytes: &[u8] = &burn.bytes;
        assert_eq!(&bytes[..data.codes.len()], &data.codes[..], "{what}: codes");
        // The params are the reference's dequantization multipliers, unpadded.
        let expected_params: Vec<u8> = match &data.scales {
            Scales::TensorScaleInv(s) => s.to_le_bytes().to_vec(),
            Scales::BlockF32 { values, .. } => {
                values.iter().flat_map(|v| v.to_le_bytes()).collect()
            }
            Scales::BlockBytes { shape, bytes, .. } => {
                let [rows, cols] = data.codes_shape;
                (0..rows)
                    .flat_map(|r| bytes[r * shape[1]..r * shape[1] + cols / 32].to_vec())
                    .collect()
            }
        };
        assert_eq!(
            &bytes[data.codes.len()..],
            &expected_params[..],
            "{what}: params"
        );
        assert_eq!(
            bits(&burn_semantics_dequantize(&burn)),
            bits(&reference_in_storage_layout(&q, d)),
            "{what}: Burn's dequantize rule against the reference"
        );
    }
}

#[test]
fn round_trip_through_burn_is_byte_exact() {
    for (q, d, _) in convertible() {
        let what = format!("{} {}", q.format.name(), d.name());
        let data = q.data(d).unwrap();
        let (format, back) = from_burn_data(&to_burn_data(q.format, d, data).unwrap()).unwrap();
        // Burn keeps no amax and no 2D flag (MXFP8 2D rowwise scales are per 1x32 block anyway).
        let expected_format = match q.format {
            QuantFormat::Mxfp8 { fp8, .. } => QuantFormat::Mxfp8 {
                fp8,
                block_2d: false,
            },
            f => f,
        };
        assert_eq!(format, expected_format, "{what}");
        let expected = QuantizedData {
            amax: None,
            ..data.clone()
        };
        assert_eq!(back, expected, "{what}");
    }
}

#[test]
fn burn_padded_per_tensor_data_reads_back() {
    // `TensorData::quantized` aligns the params to 4 bytes: 15 codes get one byte of padding.
    let codes: Vec<i8> = (0..15).map(|i| (i * 9) as i8).collect();
    let s = scheme(QuantValue::E4M3, QuantLevel::Tensor, QuantParam::F32);
    let data = TensorData::quantized(codes.clone(), [3, 5], s, &[0.375]);
    let (format, back) = from_burn_data(&data).unwrap();
    assert_eq!(
        format,
        QuantFormat::Fp8Tensor {
            fp8: Fp8Format::E4M3
        }
    );
    assert_eq!(
        back.codes,
        codes.iter().map(|&c| c as u8).collect::<Vec<_>>()
    );
    assert_eq!(back.scales, Scales::TensorScaleInv(0.375));
}

#[test]
fn what_burn_cannot_hold_is_an_error() {
    let x = common::random_matrix(128, 128, 3, 2.0);
    let nvfp4 = quantize_nvfp4(
        &x,
        &Nvfp4Config {
            block_2d: false,
            rht: false,
            stochastic_seed: None,
        },
        Usage::BOTH,
    )
    .unwrap();
    for d in DIRECTIONS {
        let err = to_burn_data(nvfp4.format, d, nvfp4.data(d).unwrap()).unwrap_err();
        assert!(err.to_string().contains("global"), "{err}");
    }
    let mx = Mxfp8Config {
        fp8: Fp8Format::E4M3,
        block_2d: false,
    };
    let mut q = quantize_mxfp8(&x, &mx, Usage::BOTH).unwrap();
    let err = to_burn_data(
        q.format,
        Direction::Columnwise,
        q.data(Direction::Columnwise).unwrap(),
    )
    .unwrap_err();
    assert!(err.to_string().contains("32x1"), "{err}");
    q.swizzle_scales().unwrap();
    let err = to_burn_data(
        q.format,
        Direction::Rowwise,
        q.data(Direction::Rowwise).unwrap(),
    )
    .unwrap_err();
    assert!(err.to_string().contains("unswizzle"), "{err}");

    // Burn tensors outside the schemes we produce.
    let int8 = TensorData::quantized(
        vec![1i8; 4],
        [2, 2],
        scheme(QuantValue::Q8S, QuantLevel::Tensor, QuantParam::F32),
        &[1.0],
    );
    assert!(from_burn_data(&int8).is_err());
    assert!(from_burn_data(&TensorData::new(vec![1.0f32; 4], [2, 2])).is_err());
    let odd_block = TensorData::from_bytes_vec(
        vec![0u8; 64 * 64 + 64 * 4],
        [64, 64],
        DType::QFloat(scheme(
            QuantValue::E4M3,
            QuantLevel::Block(BlockSize::new([1u8, 64])),
            QuantParam::F32,
        )),
    );
    assert!(from_burn_data(&odd_block).is_err());
}

#[cfg(feature = "ndarray")]
#[test]
fn ndarray_cannot_hold_fp8_and_says_so() {
    use burn::backend::NdArray;
    use burn_lowp::backend::{BytesOps, QuantizedTensor};
    let x = common::random_matrix(128, 128, 5, 2.0);
    let q =
        quantize_fp8_current(&x, &Fp8CurrentScaling::new(Fp8Format::E4M3), Usage::ROWWISE).unwrap();
    let device = Default::default();
    let t = QuantizedTensor::<NdArray>::from_host(&q, |b| NdArray::bytes_from_host(b, &device));
    let err = t.to_burn(Direction::Rowwise).unwrap_err();
    assert!(err.to_string().contains("cannot store"), "{err}");
}

/// Burn's own CUDA dequantize kernel on the converted tensors, and the device round trip.
#[cfg(feature = "cuda")]
mod cuda {
    use burn_cubecl::CubeBackend;
    use burn_lowp::backend::{BytesOps, QuantizedTensor};
    use burn_lowp_kernels::cubecl::cuda::CudaRuntime;

    use super::*;

    type Backend = CubeBackend<CudaRuntime, f32, i32, u8>;

    #[test]
    fn burn_dequantize_matches_reference_and_round_trips() {
        let Some(device) = crate::common::cuda_device() else {
            return;
        };
        for (q, d, scheme) in convertible() {
            let what = format!("{} {}", q.format.name(), d.name());
            let t =
                QuantizedTensor::<Backend>::from_host(&q, |b| Backend::bytes_from_host(b, &device));
            let burn = t.to_burn(d).unwrap();
            // Burn 0.21's CUDA dequantize of UE8M0-scaled (MXFP8) tensors does not compile on
            // sm_90: NVRTC reports `__nv_cvt_e8m0_to_bf162raw` undefined (H200, 2026-11-27). Those
            // cases check the round trip only; the host test checks their decoding by Burn's rule.
            if scheme.param != QuantParam::UE8M0 {
                let dequantized = burn
                    .clone()
                    .dequantize()
                    .into_data()
                    .into_vec::<f32>()
                    .unwrap();
                assert_eq!(
                    bits(&dequantized),
                    bits(&reference_in_storage_layout(&q, d)),
                    "{what}: Burn's CUDA dequantize against the reference"
                );
            }
            let back = QuantizedTensor::<Backend>::from_burn(burn).unwrap();
            let host = back.to_host().unwrap();
            let data = q.data(d).unwrap();
            assert_eq!(
                host.rowwise.unwrap(),
                QuantizedData {
                    amax: None,
                    ..data.clone()
                },
                "{what}: round trip"
            );
        }
    }
}
