//! Data parallelism's reduction overlapped with backward (`dist::OverlappedGradReduce` fed by
//! `ops::grad_tap`), two ranks: each tapped weight's gradient reaches the reducer when backward
//! has finished the layer that uses it, before backward goes on below (a probe op between the
//! layers records where backward is); and the gradients every rank ends with, over two
//! micro-batches, equal bit for bit those of the reduction after backward, the experts' route
//! (summed over their group, divided by the world) included.
//!
//! The ranks do not run at once: Burn's autodiff holds one process-wide lock while a backward
//! runs, so a rank blocked in a collective inside backward would keep the other from its own.
//! Each rank's step runs once to record what it gives every all-reduce (one step: no input
//! depends on a reduced value), then again with the other rank's records (`Replay`).

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::NoCheckpointing;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::{Autodiff, NdArray};
use burn::module::{Module, Param, ParamId};
use burn::optim::{GradientsAccumulator, GradientsParams};
use burn::tensor::{Tensor, TensorData, TensorPrimitive};
use burn_lowp::dist::{reduce_gradients_in, GradReduceOptions, OverlappedGradReduce, ReduceOp, ReduceScope, TensorAllReduce};
use burn_lowp::error::Result;
use burn_lowp::ops::grad_tap::{self, GradientTap, ParamTap};

type B = Autodiff<NdArray>;
type Inner = NdArray;

/// One rank's side of a two-rank all-reduce: records its input to each call and, given the
/// other rank's records, returns the reduction of the two (without them, its own input).
#[derive(Default)]
struct Replay {
    mine: Mutex<Vec<Vec<f32>>>,
    other: Option<Vec<Vec<f32>>>,
}

impl Replay {
    fn against(other: Vec<Vec<f32>>) -> Self {
        Replay { mine: Mutex::default(), other: Some(other) }
    }

    fn records(&self) -> Vec<Vec<f32>> {
        self.mine.lock().unwrap().clone()
    }
}

impl TensorAllReduce<Inner> for Replay {
    fn all_reduce(&self, tensor: Tensor<Inner, 1>, op: ReduceOp) -> Result<Tensor<Inner, 1>> {
        let device = tensor.device();
        let values: Vec<f32> = tensor.into_data().convert::<f32>().into_vec().unwrap();
        let mut mine = self.mine.lock().unwrap();
        let call = mine.len();
        mine.push(values.clone());
        let out: Vec<f32> = match &self.other {
            None => values,
            Some(other) => values
                .iter()
                .zip(&other[call])
                .map(|(&a, &b)| match op {
                    ReduceOp::Sum => a + b,
                    ReduceOp::Avg => (a + b) / 2.0,
                    ReduceOp::Max => a.max(b),
                })
                .collect(),
        };
        let n = out.len();
        Ok(Tensor::from_data(TensorData::new(out, [n]), &device))
    }
}

/// What backward did, in order: the tapped weights handed over, and the probe passed.
type Log = Arc<Mutex<Vec<&'static str>>>;

/// Identity whose backward writes "probe" in the log.
#[derive(Debug)]
struct ProbeBackward;

impl Backward<Inner, 1> for ProbeBackward {
    type State = Log;

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        ops.state.lock().unwrap().push("probe");
        let [parent] = ops.parents;
        let grad = grads.consume::<Inner>(&ops.node);
        if let Some(node) = parent {
            grads.register::<Inner>(node.id, grad);
        }
    }
}

fn probe(h: Tensor<B, 2>, log: &Log) -> Tensor<B, 2> {
    let h = h.into_primitive().tensor();
    let out = match ProbeBackward.prepare::<NoCheckpointing>([h.node.clone()]).compute_bound().stateful() {
        OpsKind::Tracked(prep) => prep.finish(log.clone(), h.primitive),
        OpsKind::UnTracked(prep) => prep.finish(h.primitive),
    };
    Tensor::from_primitive(TensorPrimitive::Float(out))
}

#[derive(Module, Debug)]
struct Net<B: burn::tensor::backend::Backend> {
    first: Param<Tensor<B, 2>>,
    /// Not tapped: reduced after backward.
    bias: Param<Tensor<B, 1>>,
    second: Param<Tensor<B, 2>>,
}

fn values(n: usize, salt: usize) -> Vec<f32> {
    (0..n).map(|i| ((i * 13 + salt * 7) % 17) as f32 / 17.0 - 0.5).collect()
}

fn net(device: &burn::tensor::Device<B>) -> Net<B> {
    let t2 = |r: usize, c: usize, salt| Tensor::<B, 2>::from_data(TensorData::new(values(r * c, salt), [r, c]), device);
    Net {
        first: Param::from_tensor(t2(4, 8, 1)),
        bias: Param::from_tensor(Tensor::from_data(TensorData::new(values(8, 2), [8]), device)),
        second: Param::from_tensor(t2(8, 3, 3)),
    }
}

impl Net<B> {
    /// `((x·W1 + b) -> probe) · W2`, squared and summed; the weights through the tap if one is
    /// installed.
    fn loss(&self, x: Tensor<B, 2>, log: &Log) -> Tensor<B, 1> {
        let h = x.clone().matmul(grad_tap::tapped(&self.first, &x)) + self.bias.val().unsqueeze();
        let h = probe(h, log);
        let y = h.clone().matmul(grad_tap::tapped(&self.second, &h));
        (y.clone() * y).sum()
    }

    fn name(&self, id: ParamId) -> &'static str {
        match id {
            id if id == self.first.id => "first",
            id if id == self.second.id => "second",
            _ => "other",
        }
    }
}

/// Rank `rank`'s input of micro-batch `m`.
fn input(rank: usize, m: usize, device: &burn::tensor::Device<B>) -> Tensor<B, 2> {
    Tensor::from_data(TensorData::new(values(5 * 4, 10 + 3 * rank + m), [5, 4]), device)
}

/// Each parameter's gradient, flat, in the model's order.
fn flat(grads: &GradientsParams, net: &Net<B>) -> Vec<Vec<u32>> {
    let bits = |t: Vec<f32>| t.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
    let v2 = |id| bits(grads.get::<Inner, 2>(id).unwrap().into_data().convert::<f32>().into_vec().unwrap());
    let v1 = |id| bits(grads.get::<Inner, 1>(id).unwrap().into_data().convert::<f32>().into_vec().unwrap());
    vec![v2(net.first.id), v1(net.bias.id), v2(net.second.id)]
}

const MICRO_BATCHES: usize = 2;
/// The experts' divisor (a world of four with two ranks holding the same experts).
const DIVISOR: usize = 4;

/// One rank's step: two micro-batches; overlapped (the weights reduced in backward, `first` as
/// an expert when `expert_route`) or every gradient after backward. Returns its gradients and
/// the log of the overlapped run's backward.
fn step(rank: usize, net: &Net<B>, groups: (Arc<Replay>, Arc<Replay>), overlapped: bool, expert_route: bool) -> (Vec<Vec<u32>>, Vec<&'static str>) {
    let device = Default::default();
    let options = GradReduceOptions::default();
    let (dense, experts) = groups;
    let log: Log = Arc::default();
    let expert_ids: HashSet<ParamId> = if expert_route { [net.first.id].into() } else { HashSet::new() };
    let mut reduce = OverlappedGradReduce::new(dense.clone() as Arc<dyn TensorAllReduce<Inner> + Send + Sync>, options);
    if expert_route {
        reduce = reduce.with_experts(expert_ids.clone(), experts.clone(), DIVISOR);
    }
    let reduce = Arc::new(reduce);
    let (sink_reduce, sink_log, names) = (reduce.clone(), log.clone(), net.clone());
    let tap: Arc<dyn ParamTap<B>> = Arc::new(GradientTap::<Inner>::new(Arc::new(move |id, grad| {
        sink_log.lock().unwrap().push(names.name(id));
        sink_reduce.take(id, grad);
    })));
    let mut accumulator = GradientsAccumulator::<Net<B>>::new();
    for m in 0..MICRO_BATCHES {
        let installed = overlapped.then(|| {
            reduce.start_micro_batch(m, MICRO_BATCHES);
            grad_tap::install::<B>(tap.clone())
        });
        let loss = net.loss(input(rank, m, &device), &log);
        drop(installed);
        let grads = loss.div_scalar(MICRO_BATCHES as f64).backward();
        accumulator.accumulate(net, GradientsParams::from_grads(grads, net));
    }
    let mut grads = accumulator.grads();
    let reduced = if overlapped { reduce.finish(&mut grads).unwrap() } else { HashSet::new() };
    let is_expert = |id| expert_ids.contains(&id) && !reduced.contains(&id);
    let is_dense = |id| !expert_ids.contains(&id) && !reduced.contains(&id);
    let grads = reduce_gradients_in::<B, _>(net, grads, experts.as_ref(), options, ReduceScope { keep: Some(&is_expert), divisor: Some(DIVISOR) }).unwrap();
    let grads = reduce_gradients_in::<B, _>(net, grads, dense.as_ref(), options, ReduceScope { keep: Some(&is_dense), divisor: None }).unwrap();
    let log = log.lock().unwrap().clone();
    (flat(&grads, net), log)
}

/// `step` of two ranks: each recorded alone, then replayed against the other's records.
fn two_ranks(overlapped: bool, expert_route: bool) -> Vec<(Vec<Vec<u32>>, Vec<&'static str>)> {
    let net = net(&Default::default());
    let records: Vec<(Vec<Vec<f32>>, Vec<Vec<f32>>)> = (0..2)
        .map(|rank| {
            let groups = (Arc::new(Replay::default()), Arc::new(Replay::default()));
            step(rank, &net, groups.clone(), overlapped, expert_route);
            (groups.0.records(), groups.1.records())
        })
        .collect();
    (0..2)
        .map(|rank| {
            let (dense, experts) = records[1 - rank].clone();
            let groups = (Arc::new(Replay::against(dense)), Arc::new(Replay::against(experts)));
            step(rank, &net, groups, overlapped, expert_route)
        })
        .collect()
}

#[test]
fn each_weight_is_reduced_when_backward_has_finished_its_layer() {
    for (_, log) in two_ranks(true, false) {
        // Per micro-batch: `second` before backward reaches the probe below it, `first` after.
        assert_eq!(log, ["second", "probe", "first", "second", "probe", "first"]);
    }
}

#[test]
fn overlapped_gradients_equal_those_reduced_after_backward() {
    for expert_route in [false, true] {
        let after = two_ranks(false, expert_route);
        let overlapped = two_ranks(true, expert_route);
        for rank in 0..2 {
            assert_eq!(overlapped[rank].0, after[rank].0, "rank {rank}, expert route {expert_route}");
        }
        // Both ranks hold the same (reduced) gradients, and they are not one rank's own.
        assert_eq!(overlapped[0].0, overlapped[1].0);
    }
    let local = two_ranks(false, false);
    assert_ne!(local[0].0, step_alone());
}

/// Rank 0's gradients with no other rank: what the reduction must change.
fn step_alone() -> Vec<Vec<u32>> {
    let net = net(&Default::default());
    step(0, &net, (Arc::new(Replay::default()), Arc::new(Replay::default())), false, false).0
}
