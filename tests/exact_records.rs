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
