//! Tensor records that load in the dtype they were saved in.
//!
//! Burn's tensor records convert floats to the precision settings' type when saved and to the
//! backend's float type when loaded: on the CUDA BF16 backend an f32 tensor (AdamW's moments,
//! delayed scaling's amax histories and scales, the router's f32 weight) came back rounded to
//! BF16. A 2-rank run resumed from its checkpoint then diverged within three steps (loss 3.8 at
//! the first resumed step against 3.19, 53 by the tenth; 2 x H200, 2026-11-28). These records
//! keep the tensor's own bytes and dtype both ways, whatever the precision settings, so that a
//! resumed run continues from exactly the state that was saved.

use burn::module::ParamId;
use burn::record::{PrecisionSettings, Record};
use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorData};
use serde::{Deserialize, Serialize};

/// A float tensor, recorded in its own dtype.
#[derive(Debug, Clone)]
pub struct ExactTensor<B: Backend, const D: usize>(pub Tensor<B, D>);

impl<B: Backend, const D: usize> Record<B> for ExactTensor<B, D> {
    type Item<S: PrecisionSettings> = TensorData;

    fn into_item<S: PrecisionSettings>(self) -> TensorData {
        self.0.into_data()
    }

    fn from_item<S: PrecisionSettings>(item: TensorData, device: &B::Device) -> Self {
        let dtype = item.dtype;
        ExactTensor(Tensor::from_data(item, (device, dtype)))
    }
}

/// A tensor with the id of the parameter or state it belongs to, recorded in its own dtype.
#[derive(Debug, Clone)]
pub struct ExactParam<B: Backend, const D: usize> {
    pub id: ParamId,
    pub tensor: Tensor<B, D>,
}

/// `ExactParam`'s saved form: the id as Burn writes a parameter's, and the data.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ExactParamItem {
    pub id: String,
    pub data: TensorData,
}

impl<B: Backend, const D: usize> Record<B> for ExactParam<B, D> {
    type Item<S: PrecisionSettings> = ExactParamItem;

    fn into_item<S: PrecisionSettings>(self) -> ExactParamItem {
        ExactParamItem {
            id: self.id.serialize(),
            data: self.tensor.into_data(),
        }
    }

    fn from_item<S: PrecisionSettings>(item: ExactParamItem, device: &B::Device) -> Self {
        let dtype = item.data.dtype;
        ExactParam {
            id: ParamId::deserialize(&item.id),
            tensor: Tensor::from_data(item.data, (device, dtype)),
        }
    }
}
