//! `StateTensor`: a tensor a module updates in place during the step (delayed-scaling scales and
//! amax histories), saved and loaded with the module record like a parameter but never trained.
//! Burn's `RunningState` is close, but averages the values written by different threads and
//! applies a write one update late; this state must hold exactly what was last written.

use std::sync::{Arc, Mutex};

use burn::module::{
    AutodiffModule, Content, Module, ModuleDisplay, ModuleDisplayDefault, ModuleMapper,
    ModuleVisitor, Param, ParamId,
};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::Tensor;

#[derive(Clone, Debug)]
pub struct StateTensor<B: Backend, const D: usize> {
    id: ParamId,
    value: Arc<Mutex<Tensor<B, D>>>,
}

impl<B: Backend, const D: usize> StateTensor<B, D> {
    pub fn new(value: Tensor<B, D>) -> Self {
        Self::with_id(ParamId::new(), value)
    }

    fn with_id(id: ParamId, value: Tensor<B, D>) -> Self {
        StateTensor {
            id,
            value: Arc::new(Mutex::new(value)),
        }
    }

    /// The current value.
    pub fn value(&self) -> Tensor<B, D> {
        self.value.lock().expect("state lock").clone()
    }

    /// Replaces the value (visible to every clone of this module).
    pub fn set(&self, value: Tensor<B, D>) {
        *self.value.lock().expect("state lock") = value;
    }
}

impl<B: Backend, const D: usize> core::fmt::Display for StateTensor<B, D> {
    fn fmt(&self, f: &mut core::fmt::Formatter) -> core::fmt::Result {
        write!(f, "StateTensor(id={})", self.id)
    }
}

impl<B: Backend, const D: usize> ModuleDisplayDefault for StateTensor<B, D> {
    fn content(&self, content: Content) -> Option<Content> {
        content.add_formatted(&"StateTensor".to_string()).optional()
    }
}

impl<B: Backend, const D: usize> ModuleDisplay for StateTensor<B, D> {}

impl<B: Backend, const D: usize> Module<B> for StateTensor<B, D> {
    type Record = Param<Tensor<B, D>>;

    /// Not visited: visitors look for parameters (Burn's `num_params`, gradient collection), and
    /// this state is not one, so a model's size counts trainable weights only. Records
    /// (`into_record` / `load_record`) and mappers (device moves) still carry it.
    fn visit<V: ModuleVisitor<B>>(&self, _visitor: &mut V) {}

    fn map<M: ModuleMapper<B>>(self, mapper: &mut M) -> Self {
        let (_, tensor, _) = mapper
            .map_float(Param::initialized(self.id, self.value()))
            .consume();
        self.set(tensor);
        self
    }

    fn into_record(self) -> Self::Record {
        Param::initialized(self.id, self.value())
    }

    fn load_record(mut self, record: Self::Record) -> Self {
        let device = self.value().device();
        self.id = record.id;
        self.set(record.val().to_device(&device));
        self
    }

    fn to_device(self, device: &B::Device) -> Self {
        self.set(self.value().to_device(device));
        self
    }

    fn fork(self, device: &B::Device) -> Self {
        self.to_device(device)
    }

    fn collect_devices(&self, mut devices: Vec<B::Device>) -> Vec<B::Device> {
        let device = self.value().device();
        if !devices.contains(&device) {
            devices.push(device);
        }
        devices
    }
}

impl<B: AutodiffBackend, const D: usize> AutodiffModule<B> for StateTensor<B, D> {
    type InnerModule = StateTensor<B::InnerBackend, D>;

    fn valid(&self) -> Self::InnerModule {
        StateTensor::with_id(self.id, self.value().inner())
    }

    fn from_inner(module: Self::InnerModule) -> Self {
        StateTensor::with_id(module.id, Tensor::from_inner(module.value()))
    }
}
