//! The quantized-weight cache of a module across micro-batches (TE `is_first_microbatch`), also
//! used for other values a module keeps between calls only while its parameters stay as they are
//! (`GroupedLinear`'s deferred weight gradients and `main_grad`). It is module state that is never saved, and it empties itself whenever the module's tensors
//! are mapped, loaded or moved: an optimizer step (which maps the parameters) or a record load
//! changes the weight, so the cache must not outlive it.

use std::any::Any;
use std::marker::PhantomData;
use std::sync::{Arc, Mutex};

use burn::module::{
    AutodiffModule, Content, EmptyRecord, Module, ModuleDisplay, ModuleDisplayDefault,
    ModuleMapper, ModuleVisitor,
};
use burn::tensor::backend::{AutodiffBackend, Backend};

/// Holds one quantized weight or other transient value (type-erased so that the module needs no extra bounds). Generic
/// over the backend only so that Burn's module derive visits it (it skips non-generic fields).
pub struct WeightCache<B: Backend> {
    slot: Arc<Mutex<Option<Arc<dyn Any + Send + Sync>>>>,
    backend: PhantomData<fn() -> B>,
}

impl<B: Backend> Clone for WeightCache<B> {
    fn clone(&self) -> Self {
        WeightCache {
            slot: self.slot.clone(),
            backend: PhantomData,
        }
    }
}

impl<B: Backend> Default for WeightCache<B> {
    fn default() -> Self {
        WeightCache {
            slot: Arc::default(),
            backend: PhantomData,
        }
    }
}

impl<B: Backend> std::fmt::Debug for WeightCache<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "WeightCache({})",
            if self.get_any().is_some() {
                "filled"
            } else {
                "empty"
            }
        )
    }
}

impl<B: Backend> WeightCache<B> {
    fn get_any(&self) -> Option<Arc<dyn Any + Send + Sync>> {
        self.slot.lock().expect("cache lock").clone()
    }

    /// The cached value, if it holds a `T`.
    pub fn get<T: Clone + 'static>(&self) -> Option<T> {
        self.get_any().and_then(|v| v.downcast_ref::<T>().cloned())
    }

    pub fn set<T: Send + Sync + 'static>(&self, value: T) {
        *self.slot.lock().expect("cache lock") = Some(Arc::new(value));
    }

    pub fn clear(&self) {
        *self.slot.lock().expect("cache lock") = None;
    }

    /// A new, empty cache (so that clones of a mapped module do not share the old one).
    fn emptied(self) -> Self {
        WeightCache::default()
    }
}

impl<B: Backend> std::fmt::Display for WeightCache<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{self:?}")
    }
}

impl<B: Backend> ModuleDisplayDefault for WeightCache<B> {
    fn content(&self, content: Content) -> Option<Content> {
        content.add_single(&format!("{self:?}")).optional()
    }
}

impl<B: Backend> ModuleDisplay for WeightCache<B> {}

impl<B: Backend> Module<B> for WeightCache<B> {
    type Record = EmptyRecord;

    fn visit<V: ModuleVisitor<B>>(&self, _visitor: &mut V) {}

    fn map<M: ModuleMapper<B>>(self, _mapper: &mut M) -> Self {
        self.emptied()
    }

    fn load_record(self, _record: Self::Record) -> Self {
        self.emptied()
    }

    fn into_record(self) -> Self::Record {
        EmptyRecord::new()
    }

    fn to_device(self, _device: &B::Device) -> Self {
        self.emptied()
    }

    fn fork(self, _device: &B::Device) -> Self {
        self.emptied()
    }

    fn collect_devices(&self, devices: Vec<B::Device>) -> Vec<B::Device> {
        devices
    }
}

impl<B: AutodiffBackend> AutodiffModule<B> for WeightCache<B> {
    type InnerModule = WeightCache<B::InnerBackend>;

    fn valid(&self) -> Self::InnerModule {
        WeightCache::default()
    }

    fn from_inner(_module: Self::InnerModule) -> Self {
        WeightCache::default()
    }
}
