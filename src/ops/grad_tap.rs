//! A parameter's gradient handed out of backward the moment it is complete: the hook data
//! parallelism needs to start a gradient's all-reduce while backward still runs (Megatron's DDP
//! registers one per parameter; Burn 0.21 has none: `backward()` returns every gradient
//! together).
//!
//! A layer passes its weight through `tapped` where it uses it: while a `ParamTap` is installed
//! on the thread (`install`), the weight enters the layer's op through an identity op whose
//! backward takes the weight's gradient out of the graph and gives it to the tap's sink (a
//! `GradientTap`); the weight then gets no gradient in Burn's `Gradients`, the sink owns it.
//! Without a tap installed, or for a weight that needs no gradient, `tapped` is the weight.
//!
//! When the backward runs: Burn's autodiff runs the graph by depth (a node's depth is one more
//! than its deepest parent's), deepest first. A weight is a leaf (depth 0), so an identity op on
//! it alone would have depth 1 and run at the very end of backward, after every layer. The tap
//! therefore has a second parent, the layer's input (`anchor`), which it gives no gradient: its
//! depth is the input's plus one, so it runs right after the layer's op (one deeper) and before
//! the layers below it, and the sink gets each layer's weight gradient in the order backward
//! reaches the layers.

use std::any::Any;
use std::cell::RefCell;
use std::fmt;
use std::sync::Arc;

use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::Autodiff;
use burn::module::{Param, ParamId};
use burn::tensor::backend::Backend;
use burn::tensor::ops::FloatTensor;
use burn::tensor::{Tensor, TensorPrimitive};

/// Passes a weight into a layer's op so that its gradient leaves backward through the tap.
pub trait ParamTap<B: Backend>: Send + Sync {
    /// `weight` (of parameter `id`) unchanged, its gradient going to the tap once complete;
    /// `anchor` is the layer's input (see the module's docs: when backward gets there).
    fn tap(&self, id: ParamId, weight: FloatTensor<B>, anchor: FloatTensor<B>) -> FloatTensor<B>;
}

/// Receives a parameter's gradient of one backward, on the thread running backward, in the
/// order backward produces them. A weight used twice in one forward is handed over twice
/// (once per use, the two parts summing to its gradient).
pub type GradientSink<IB> = Arc<dyn Fn(ParamId, FloatTensor<IB>) + Send + Sync>;

/// The tap of `Autodiff<IB>`: an identity op whose backward hands the gradient to `sink`.
pub struct GradientTap<IB: Backend> {
    sink: GradientSink<IB>,
}

impl<IB: Backend> GradientTap<IB> {
    pub fn new(sink: GradientSink<IB>) -> Self {
        GradientTap { sink }
    }
}

/// The op's state: the sink and the parameter (`Backward::State` must be `Debug`).
#[derive(Clone)]
struct TapState<IB: Backend> {
    sink: GradientSink<IB>,
    id: ParamId,
}

impl<IB: Backend> fmt::Debug for TapState<IB> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "gradient tap of {}", self.id)
    }
}

#[derive(Debug)]
struct TapBackward;

impl<IB: Backend> Backward<IB, 2> for TapBackward {
    type State = TapState<IB>;

    fn backward(self, ops: Ops<Self::State, 2>, grads: &mut Gradients, _: &mut Checkpointer) {
        // Neither parent gets a gradient here: the weight's goes to the sink, the anchor's
        // comes from the layer's op.
        let grad = grads.consume::<IB>(&ops.node);
        (ops.state.sink)(ops.state.id, grad);
    }
}

impl<IB: Backend, C: CheckpointStrategy> ParamTap<Autodiff<IB, C>> for GradientTap<IB> {
    fn tap(&self, id: ParamId, weight: FloatTensor<Autodiff<IB, C>>, anchor: FloatTensor<Autodiff<IB, C>>) -> FloatTensor<Autodiff<IB, C>> {
        let state = TapState { sink: self.sink.clone(), id };
        match TapBackward.prepare::<C>([weight.node.clone(), anchor.node.clone()]).compute_bound().stateful() {
            OpsKind::Tracked(prep) => prep.finish(state, weight.primitive),
            OpsKind::UnTracked(prep) => prep.finish(weight.primitive),
        }
    }
}

thread_local! {
    /// The installed tap: an `Arc<dyn ParamTap<B>>` of the backend its installer trains on.
    static ACTIVE: RefCell<Option<Box<dyn Any>>> = const { RefCell::new(None) };
}

/// Uninstalls the tap when dropped (restoring the one installed before).
pub struct Installed {
    previous: Option<Box<dyn Any>>,
}

impl Drop for Installed {
    fn drop(&mut self) {
        let previous = self.previous.take();
        ACTIVE.with(|a| *a.borrow_mut() = previous);
    }
}

/// Installs `tap` on this thread for the layers of backend `B` that run forward while the
/// returned guard lives (backward may run after it is dropped: the graph keeps the tap).
pub fn install<B: Backend>(tap: Arc<dyn ParamTap<B>>) -> Installed {
    let previous = ACTIVE.with(|a| a.borrow_mut().replace(Box::new(tap) as Box<dyn Any>));
    Installed { previous }
}

/// `param`'s value for a layer whose input is `anchor`: through the installed tap when there is
/// one for `B` and the parameter needs a gradient, else the value itself.
pub fn tapped<B: Backend, const D: usize, const K: usize>(param: &Param<Tensor<B, D>>, anchor: &Tensor<B, K>) -> Tensor<B, D> {
    let weight = param.val();
    if !param.is_require_grad() {
        return weight;
    }
    let tap = ACTIVE.with(|a| {
        a.borrow()
            .as_ref()
            .and_then(|t| t.downcast_ref::<Arc<dyn ParamTap<B>>>())
            .cloned()
    });
    match tap {
        Some(tap) => {
            let out = tap.tap(param.id, weight.into_primitive().tensor(), anchor.clone().into_primitive().tensor());
            Tensor::from_primitive(TensorPrimitive::Float(out))
        }
        None => weight,
    }
}
