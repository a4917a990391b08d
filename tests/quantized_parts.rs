//! Quantized storages as Burn tensors (`QuantizedTensorParts`): for every format (NVFP4 and a
//! hybrid tensor too), the parts hold the storage's exact bytes as `U8` codes and f32 / `U8`
//! scales, move with `to_device`, save and load through Burn's recorders (under full and half
//! precision settings alike), and come back as the same storage byte for byte. Shapes, kinds and
//! values that do not fit are errors naming the tensor. NdArray always; wgpu with the `wgpu`
//! feature (CubeCL: the parts share the storage's device buffers).

mod common;

use burn::record::{FullPrecisionSettings, HalfPrecisionSettings, NamedMpkBytesRecorder, Recorder};
use burn::tensor::{DType, Int, Tensor, TensorData};
use burn_lowp::backend::{
    LowpBackend, QuantizedParts, QuantizedTensor, QuantizedTensorParts, ScaleParts, Storage,
};
use burn_lowp::format::{
    quantize_fp8_block, quantize_fp8_current, quantize_mxfp8, quantize_nvfp4, BlockShape,
    Direction, Fp8BlockScaling, Fp8CurrentScaling, Fp8Format, HostQuantized, Mxfp8Config,
    Nvfp4Config, QuantizedData, Scales, Usage,
};

/// Every format, both directions: FP8 per-tensor, FP8 block 1x128 and 128x128, MXFP8 1D and 2D,
/// NVFP4 with and without 2D blocks and RHT.
fn host_cases() -> Vec<HostQuantized> {
    let x = common::random_matrix(256, 384, 11, 6.0);
    let mut cases = Vec::new();
    for fp8 in [Fp8Format::E4M3, Fp8Format::E5M2] {
        cases.push(quantize_fp8_current(&x, &Fp8CurrentScaling::new(fp8), Usage::BOTH).unwrap());
        for block in [
            BlockShape::OneByOneTwentyEight,
            BlockShape::OneTwentyEightSquare,
        ] {
            cases.push(
                quantize_fp8_block(&x, &Fp8BlockScaling::new(fp8, block), Usage::BOTH).unwrap(),
            );
        }
        for block_2d in [false, true] {
            cases.push(quantize_mxfp8(&x, &Mxfp8Config { fp8, block_2d }, Usage::BOTH).unwrap());
        }
    }
    for (block_2d, rht) in [(false, false), (true, false), (false, true)] {
        let config = Nvfp4Config {
            block_2d,
            rht,
            stochastic_seed: None,
        };
        cases.push(quantize_nvfp4(&x, &config, Usage::BOTH).unwrap());
    }
    cases
}

fn upload<B: LowpBackend>(q: &HostQuantized, device: &B::Device) -> QuantizedTensor<B> {
    QuantizedTensor::from_host(q, |b| B::bytes_from_host(b, device))
}

/// The storage of `direction` read back to the host.
fn host_side<B: LowpBackend>(
    t: &QuantizedTensor<B>,
    direction: Direction,
) -> Option<QuantizedData> {
    t.storage(direction)
        .map(|_| t.quantized(direction).unwrap().to_host())
}

/// A hybrid tensor: MXFP8 rowwise, NVFP4 columnwise.
fn hybrid<B: LowpBackend>(device: &B::Device) -> QuantizedTensor<B> {
    let x = common::random_matrix(256, 384, 12, 3.0);
    let mx = quantize_mxfp8(
        &x,
        &Mxfp8Config {
            fp8: Fp8Format::E4M3,
            block_2d: false,
        },
        Usage::ROWWISE,
    )
    .unwrap();
    let config = Nvfp4Config {
        block_2d: false,
        rht: true,
        stochastic_seed: None,
    };
    let nv = quantize_nvfp4(&x, &config, Usage::COLUMNWISE).unwrap();
    let mut t = upload::<B>(&mx, device);
    t.columnwise = upload::<B>(&nv, device).columnwise;
    t
}

fn u8_values<B: LowpBackend>(t: &Tensor<B, 2, Int>) -> Vec<u8> {
    let data = t.to_data();
    assert_eq!(
        data.dtype,
        DType::U8,
        "codes and scale bytes are U8 tensors"
    );
    data.bytes.to_vec()
}

fn f32_values<B: LowpBackend, const D: usize>(t: &Tensor<B, D>) -> Vec<f32> {
    let data = t.to_data();
    assert_eq!(data.dtype, DType::F32, "f32 scales and amaxes stay f32");
    data.into_vec::<f32>().unwrap()
}

/// The parts hold the storage's very bytes: codes, scales and amax, in the stated dtypes.
fn assert_parts_hold(what: &str, parts: &QuantizedParts<impl LowpBackend>, data: &QuantizedData) {
    assert_eq!(parts.codes.dims(), data.codes_shape, "{what}: codes shape");
    assert_eq!(u8_values(&parts.codes), data.codes, "{what}: codes");
    match (&parts.scales, &data.scales) {
        (ScaleParts::TensorScaleInv(s), Scales::TensorScaleInv(v)) => {
            assert_eq!(
                f32_values(s)
                    .iter()
                    .map(|x| x.to_bits())
                    .collect::<Vec<_>>(),
                vec![v.to_bits()],
                "{what}"
            )
        }
        (ScaleParts::BlockF32(s), Scales::BlockF32 { shape, values }) => {
            assert_eq!(&s.dims(), shape, "{what}: block scales shape");
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&f32_values(s)), bits(values), "{what}: block scales");
        }
        (
            ScaleParts::BlockBytes { bytes, layout },
            Scales::BlockBytes {
                shape,
                bytes: want,
                layout: want_layout,
            },
        ) => {
            assert_eq!(&bytes.dims(), shape, "{what}: scale bytes shape");
            assert_eq!(layout, want_layout, "{what}: layout");
            assert_eq!(&u8_values(bytes), want, "{what}: scale bytes");
        }
        (have, want) => panic!("{what}: scales {have:?} for {want:?}"),
    }
    assert_eq!(
        parts.amax.as_ref().map(|a| f32_values(a)[0].to_bits()),
        data.amax.map(f32::to_bits),
        "{what}: amax"
    );
}

/// Both directions of `t` through the parts (and `to_device`, and Burn's recorders) and back.
fn check_tensor<B: LowpBackend>(what: &str, t: &QuantizedTensor<B>, device: &B::Device) {
    let parts = QuantizedTensorParts::from_tensor(t).unwrap();
    for (direction, side) in [
        (Direction::Rowwise, &parts.rowwise),
        (Direction::Columnwise, &parts.columnwise),
    ] {
        let want = host_side(t, direction);
        assert_eq!(side.is_some(), want.is_some(), "{what}");
        if let (Some(p), Some(data)) = (side, &want) {
            assert_parts_hold(&format!("{what} {}", direction.name()), p, data);
        }
    }
    let back_of = |parts: QuantizedTensorParts<B>, how: &str| {
        let back = parts.into_tensor().unwrap();
        assert_eq!((back.rows, back.cols), (t.rows, t.cols), "{what} {how}");
        for direction in [Direction::Rowwise, Direction::Columnwise] {
            assert_eq!(
                host_side(&back, direction),
                host_side(t, direction),
                "{what} {how}: {}",
                direction.name()
            );
            if let (Some(Storage::Quantized(a)), Some(Storage::Quantized(b))) =
                (back.storage(direction), t.storage(direction))
            {
                assert_eq!(a.format, b.format, "{what} {how}");
            }
        }
    };
    back_of(parts.clone(), "round trip");
    back_of(parts.clone().to_device(device), "to_device");

    let full = NamedMpkBytesRecorder::<FullPrecisionSettings>::new();
    let bytes = Recorder::<B>::record(&full, parts.clone(), ()).unwrap();
    let loaded: QuantizedTensorParts<B> = Recorder::<B>::load(&full, bytes, device).unwrap();
    back_of(loaded, "full-precision record");
    // Half precision would turn f32 tensors into f16: the parts' items keep their bytes.
    let half = NamedMpkBytesRecorder::<HalfPrecisionSettings>::new();
    let bytes = Recorder::<B>::record(&half, parts, ()).unwrap();
    let loaded: QuantizedTensorParts<B> = Recorder::<B>::load(&half, bytes, device).unwrap();
    back_of(loaded, "half-precision record");
}

fn check_every_format<B: LowpBackend>(device: &B::Device) {
    for q in host_cases() {
        check_tensor(&q.format.name(), &upload::<B>(&q, device), device);
    }
    check_tensor("hybrid(mxfp8, nvfp4)", &hybrid::<B>(device), device);
}

fn check_errors<B: LowpBackend>(device: &B::Device) {
    let x = common::random_matrix(128, 256, 13, 2.0);
    let q = quantize_mxfp8(
        &x,
        &Mxfp8Config {
            fp8: Fp8Format::E4M3,
            block_2d: false,
        },
        Usage::ROWWISE,
    )
    .unwrap();
    let parts = QuantizedTensorParts::from_tensor(&upload::<B>(&q, device)).unwrap();

    // Codes of the wrong shape.
    let mut bad = parts.clone();
    let p = bad.rowwise.as_mut().unwrap();
    p.codes = p.codes.clone().reshape([256, 128]);
    let err = bad.into_tensor().unwrap_err().to_string();
    assert!(
        err.contains("rowwise codes") && err.contains("[128, 256]"),
        "{err}"
    );

    // f32 scales where the format keeps scale bytes.
    let mut bad = parts.clone();
    bad.rowwise.as_mut().unwrap().scales = ScaleParts::BlockF32(Tensor::zeros([128, 8], device));
    let err = bad.into_tensor().unwrap_err().to_string();
    assert!(
        err.contains("BlockF32") && err.contains("scale bytes"),
        "{err}"
    );

    // Codes that are not bytes.
    let mut bad = parts.clone();
    let p = bad.rowwise.as_mut().unwrap();
    let values: Vec<i32> = (0..128 * 256)
        .map(|i| if i == 5 { 300 } else { 1 })
        .collect();
    p.codes = Tensor::from_data(TensorData::new(values, [128, 256]), device);
    let err = bad.into_tensor().unwrap_err().to_string();
    assert!(err.contains("codes") && err.contains("300"), "{err}");

    // Int codes of another dtype holding bytes convert exactly.
    let mut wide = parts.clone();
    let p = wide.rowwise.as_mut().unwrap();
    let codes: Vec<i32> = u8_values(&p.codes).iter().map(|&b| b as i32).collect();
    p.codes = Tensor::from_data(TensorData::new(codes, [128, 256]), device);
    let back = wide.into_tensor().unwrap();
    assert_eq!(host_side(&back, Direction::Rowwise), q.rowwise);

    // An identity storage is a Burn float tensor already.
    let identity = QuantizedTensor::<B> {
        rows: 2,
        cols: 2,
        rowwise: Some(Storage::HighPrecision(
            Tensor::<B, 2>::zeros([2, 2], device)
                .into_primitive()
                .tensor(),
        )),
        columnwise: None,
    };
    let err = QuantizedTensorParts::from_tensor(&identity)
        .unwrap_err()
        .to_string();
    assert!(err.contains("high-precision"), "{err}");
}

#[cfg(feature = "ndarray")]
mod ndarray {
    use burn::backend::NdArray;

    #[test]
    fn every_format_round_trips_through_burn_tensors_and_records() {
        super::check_every_format::<NdArray>(&Default::default());
    }

    #[test]
    fn parts_that_do_not_fit_are_errors() {
        super::check_errors::<NdArray>(&Default::default());
    }
}

#[cfg(feature = "wgpu")]
mod wgpu {
    use burn_cubecl::CubeBackend;
    use burn_lowp_kernels::cubecl::wgpu::{WgpuDevice, WgpuRuntime};

    type Backend = CubeBackend<WgpuRuntime, f32, i32, u32>;

    fn device() -> Option<WgpuDevice> {
        crate::common::probe_device(
            "wgpu",
            "LOWP_REQUIRE_WGPU",
            burn_lowp::backend::device::wgpu_available,
        )
        .then(WgpuDevice::default)
    }

    #[test]
    fn every_format_round_trips_through_burn_tensors_and_records() {
        let Some(device) = device() else { return };
        super::check_every_format::<Backend>(&device);
    }

    #[test]
    fn parts_that_do_not_fit_are_errors() {
        let Some(device) = device() else { return };
        super::check_errors::<Backend>(&device);
    }
}

#[cfg(feature = "cuda")]
mod cuda {
    use burn_cubecl::CubeBackend;
    use burn_lowp_kernels::cubecl::cuda::CudaRuntime;

    type Backend = CubeBackend<CudaRuntime, f32, i32, u8>;

    #[test]
    fn every_format_round_trips_through_burn_tensors_and_records() {
        let Some(device) = crate::common::cuda_device() else {
            return;
        };
        super::check_every_format::<Backend>(&device);
    }

    #[test]
    fn parts_that_do_not_fit_are_errors() {
        let Some(device) = crate::common::cuda_device() else {
            return;
        };
        super::check_errors::<Backend>(&device);
    }
}
