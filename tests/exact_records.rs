//! Records that keep a tensor's dtype (`backend::exact_record`): a state tensor or AdamW moment
//! of a dtype other than the backend's float type comes back from a checkpoint with the same
//! dtype and the same bits. Burn's own tensor records round it to the precision settings' type
//! on save and to the backend's on load (BF16 on the CUDA BF16 backend, where a resumed run
//! diverged). Here the backend's float type is f32 and the tensors f64, holding values f32
//! cannot: a rounding record would lose them.

use burn::backend::NdArray;
use burn::module::Module;
use burn::record::{BinBytesRecorder, FullPrecisionSettings, HalfPrecisionSettings, NamedMpkBytesRecorder, Recorder};
use burn::tensor::{DType, Tensor, TensorData};
use burn_lowp::backend::exact_record::ExactTensor;
use burn_lowp::quant::StateTensor;

type B = NdArray;

/// Values an f32 (and a BF16 or f16) cannot hold.
fn fine_values() -> Vec<f64> {
    vec![1.0 + 2f64.powi(-40), -3.0e-300, 1.0e300, 0.1]
}

fn f64_tensor() -> Tensor<B, 2> {
    Tensor::from_data(TensorData::new(fine_values(), [2, 2]), (&Default::default(), DType::F64))
}

fn f64s(t: Tensor<B, 2>) -> Vec<f64> {
    assert_eq!(t.dtype(), DType::F64, "the dtype came back");
    t.into_data().into_vec::<f64>().unwrap()
}

#[test]
fn a_state_tensor_comes_back_in_its_dtype_bit_for_bit() {
    let device = Default::default();
    let state = StateTensor::new(f64_tensor());
    let full = BinBytesRecorder::<FullPrecisionSettings>::new();
    let bytes = Recorder::<B>::record(&full, state.clone().into_record(), ()).unwrap();
    let loaded = StateTensor::new(Tensor::<B, 2>::zeros([2, 2], &device)).load_record(Recorder::<B>::load(&full, bytes, &device).unwrap());
    assert_eq!(f64s(loaded.value()), fine_values());
    // Half-precision settings (which round Burn's own float records to f16) change nothing.
    let half = NamedMpkBytesRecorder::<HalfPrecisionSettings>::new();
    let bytes = Recorder::<B>::record(&half, state.into_record(), ()).unwrap();
    let loaded = StateTensor::new(Tensor::<B, 2>::zeros([2, 2], &device)).load_record(Recorder::<B>::load(&half, bytes, &device).unwrap());
    assert_eq!(f64s(loaded.value()), fine_values());
}

#[test]
fn an_exact_tensor_record_keeps_its_dtype_and_bits() {
    let device = Default::default();
    let full = BinBytesRecorder::<FullPrecisionSettings>::new();
    let bytes = Recorder::<B>::record(&full, ExactTensor(f64_tensor()), ()).unwrap();
    let loaded: ExactTensor<B, 2> = Recorder::<B>::load(&full, bytes, &device).unwrap();
    assert_eq!(f64s(loaded.0), fine_values());
}

/// A parameter of another dtype than the backend's is saved exactly beside the module record and
/// goes back bit for bit into the module that loaded the (rounding) record; parameters of the
/// backend's dtype are not saved twice, and a saved parameter the module lacks is an error.
#[test]
fn parameters_of_another_dtype_are_saved_and_restored_bit_for_bit() {
    use burn::module::{Param, ParamId};
    use burn_lowp::backend::exact_record::{exact_params, restore_exact_params, ExactParam};

    let device = Default::default();
    let fine = Param::from_tensor(f64_tensor());
    let plain = Param::from_tensor(Tensor::<B, 2>::ones([2, 2], &device));
    assert!(exact_params(&plain).is_empty(), "an f32 parameter on an f32 backend needs no exact copy");
    let saved = exact_params(&fine);
    assert_eq!(saved.len(), 1);
    let full = BinBytesRecorder::<FullPrecisionSettings>::new();
    let bytes = Recorder::<B>::record(&full, saved, ()).unwrap();
    let saved: Vec<ExactParam<B, 1>> = Recorder::<B>::load(&full, bytes, &device).unwrap();
    // What a module record gives back on this backend: the value rounded to f32.
    let rounded = Param::initialized(fine.id, f64_tensor().cast(DType::F32));
    let restored = restore_exact_params(rounded, saved.clone()).unwrap();
    assert_eq!(f64s(restored.val()), fine_values());
    let other = Param::initialized(ParamId::new(), f64_tensor());
    let err = restore_exact_params(other, saved).unwrap_err().to_string();
    assert!(err.contains(&fine.id.to_string()) && err.contains("parameter of the module"), "{err}");
}
