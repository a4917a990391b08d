//! Tensor records that load in the dtype they were saved in.
//!
//! Burn's tensor records convert floats to the precision settings' type when saved and to the
//! backend's float type when loaded: on the CUDA BF16 backend an f32 tensor (AdamW's moments,
//! delayed scaling's amax histories and scales, the router's f32 weight) came back rounded to
//! BF16. A 2-rank run resumed from its checkpoint then diverged within three steps (loss 3.8 at
//! the first resumed step against 3.19, 53 by the tenth; 2 x H200, 2026-11-28). These records
//! keep the tensor's own bytes and dtype both ways, whatever the precision settings, so that a
//! resumed run continues from exactly the state that was saved.

use std::collections::HashMap;

use burn::module::{Module, ModuleMapper, ModuleVisitor, Param, ParamId};
use burn::record::{PrecisionSettings, Record};
use burn::tensor::backend::Backend;
use burn::tensor::{Element, Tensor, TensorData};
use serde::{Deserialize, Serialize};

use crate::error::{LowpError, Result};

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

/// The float parameters of `module` whose dtype is not the backend's float type (the router's
/// f32 weight on a BF16 backend), flattened, with their ids: what a module record, loaded in the
/// backend's float type, would round. Saved beside it, they go back with `restore_exact_params`.
pub fn exact_params<B: Backend, M: Module<B>>(module: &M) -> Vec<ExactParam<B, 1>> {
    let mut found = ExactFloats(Vec::new());
    module.visit(&mut found);
    found.0
}

/// Gives each parameter of `module` that `saved` holds (by id) its saved value and dtype, bit for
/// bit. A saved parameter the module does not have is an error naming it.
pub fn restore_exact_params<B: Backend, M: Module<B>>(module: M, saved: Vec<ExactParam<B, 1>>) -> Result<M> {
    let mut restore = RestoreExact(saved.into_iter().map(|p| (p.id, p.tensor)).collect());
    let module = module.map(&mut restore);
    match restore.0.keys().next() {
        Some(id) => Err(LowpError::invalid(
            "saved exact parameter",
            id.to_string(),
            "must be a parameter of the module it is restored into",
        )),
        None => Ok(module),
    }
}

struct ExactFloats<B: Backend>(Vec<ExactParam<B, 1>>);

impl<B: Backend> ModuleVisitor<B> for ExactFloats<B> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        let value = param.val();
        if value.dtype() != <B::FloatElem as Element>::dtype() {
            let n = value.shape().num_elements();
            self.0.push(ExactParam { id: param.id, tensor: value.reshape([n]) });
        }
    }
}

/// Takes each parameter found in the map out of it, giving the parameter that value.
struct RestoreExact<B: Backend>(HashMap<ParamId, Tensor<B, 1>>);

impl<B: Backend> ModuleMapper<B> for RestoreExact<B> {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
        match self.0.remove(&param.id) {
            Some(saved) => param.map(|t| {
                let value = saved.reshape(t.shape());
                if t.is_require_grad() { value.require_grad() } else { value }
            }),
            None => param,
        }
    }
}
