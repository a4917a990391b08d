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

use crate::backend::exact_record::ExactParam;

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
    /// In the state's own dtype (an f32 history on a BF16 backend stays f32, bit for bit).
    type Record = ExactParam<B, D>;

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
        ExactParam {
            id: self.id,
            tensor: self.value(),
        }
    }

    fn load_record(mut self, record: Self::Record) -> Self {
        let device = self.value().device();
        self.id = record.id;
        self.set(record.tensor.to_device(&device));
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

/// Module state that may be absent: an `Option` of a module made of [`StateTensor`]s (delayed
/// scaling's scales and histories, a router's expert bias). Burn's own `Option<Module>` skips
/// `load_record` for a module without parameters (it takes it for a constant), and state has no
/// parameters by design (so that `num_params` counts trainable weights only); a plain `Option`
/// would drop the state on every checkpoint load. This one always loads. Its record is the
/// `Option`'s, so files are the same.
#[derive(Clone, Debug)]
pub struct OptionalState<M>(pub Option<M>);

impl<M> std::ops::Deref for OptionalState<M> {
    type Target = Option<M>;

    fn deref(&self) -> &Option<M> {
        &self.0
    }
}

impl<M> From<Option<M>> for OptionalState<M> {
    fn from(value: Option<M>) -> Self {
        OptionalState(value)
    }
}

impl<M: ModuleDisplay> ModuleDisplayDefault for OptionalState<M> {
    fn content(&self, content: Content) -> Option<Content> {
        self.0.content(content)
    }
}

impl<M: ModuleDisplay> ModuleDisplay for OptionalState<M> {}

impl<B: Backend, M: Module<B> + core::fmt::Debug> Module<B> for OptionalState<M> {
    type Record = Option<M::Record>;

    fn visit<V: ModuleVisitor<B>>(&self, visitor: &mut V) {
        self.0.visit(visitor)
    }

    fn map<Mm: ModuleMapper<B>>(self, mapper: &mut Mm) -> Self {
        OptionalState(self.0.map(|m| m.map(mapper)))
    }

    /// Loads whenever both sides hold the state (no "constant" shortcut, see the type's doc).
    fn load_record(self, record: Self::Record) -> Self {
        match (self.0, record) {
            (Some(module), Some(record)) => OptionalState(Some(module.load_record(record))),
            (module, _) => OptionalState(module),
        }
    }

    fn into_record(self) -> Self::Record {
        self.0.map(Module::into_record)
    }

    fn to_device(self, device: &B::Device) -> Self {
        OptionalState(self.0.to_device(device))
    }

    fn fork(self, device: &B::Device) -> Self {
        OptionalState(self.0.fork(device))
    }

    fn collect_devices(&self, devices: Vec<B::Device>) -> Vec<B::Device> {
        self.0.collect_devices(devices)
    }
}

impl<B: AutodiffBackend, M: AutodiffModule<B> + core::fmt::Debug> AutodiffModule<B> for OptionalState<M> {
    type InnerModule = OptionalState<M::InnerModule>;

    fn valid(&self) -> Self::InnerModule {
        OptionalState(self.0.valid())
    }

    fn from_inner(module: Self::InnerModule) -> Self {
        OptionalState(Option::<M>::from_inner(module.0))
    }
}
