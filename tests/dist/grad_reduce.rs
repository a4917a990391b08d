//! Data parallel gradient averaging (`dist::reduce_gradients`) with threads as ranks: each rank
//! has its own gradients; after the reduction over a CPU stand-in for NCCL, every rank holds the
//! mean of them, a parameter no rank had a gradient for holds zeros, and the buckets respect the
//! cap.

use std::sync::{Arc, Barrier, Mutex};

use burn::backend::{Autodiff, NdArray};
use burn::module::{Module, Param};
use burn::nn::Linear;
use burn::optim::GradientsParams;
use burn::tensor::{Tensor, TensorData};
use burn_lowp::dist::grad_reduce::gradient_buckets;
use burn_lowp::dist::{reduce_gradients, GradReduceOptions, ReduceOp, TensorAllReduce};
use burn_lowp::error::Result;

type B = Autodiff<NdArray>;
type Inner = NdArray;

/// An all-reduce between threads: each puts its values in, waits for the others, reduces.
struct ThreadGroup {
    rank: usize,
    slots: Arc<Mutex<Vec<Vec<f32>>>>,
    barrier: Arc<Barrier>,
    calls: Mutex<Vec<usize>>,
}

impl TensorAllReduce<Inner> for ThreadGroup {
    fn all_reduce(&self, tensor: Tensor<Inner, 1>, op: ReduceOp) -> Result<Tensor<Inner, 1>> {
        let device = tensor.device();
        let values: Vec<f32> = tensor.into_data().convert::<f32>().into_vec().unwrap();
        self.calls.lock().unwrap().push(values.len());
        self.slots.lock().unwrap()[self.rank] = values;
        self.barrier.wait();
        let out: Vec<f32> = {
            let slots = self.slots.lock().unwrap();
            let n = slots.len() as f32;
            (0..slots[0].len())
                .map(|i| {
                    let column = slots.iter().map(|s| s[i]);
                    match op {
                        ReduceOp::Sum => column.sum(),
                        ReduceOp::Avg => column.sum::<f32>() / n,
                        ReduceOp::Max => column.fold(f32::MIN, f32::max),
                    }
                })
                .collect()
        };
        self.barrier.wait();
        let len = out.len();
        Ok(Tensor::from_data(TensorData::new(out, [len]), &device))
    }
}

#[derive(Module, Debug)]
// The generic must be named `B`: Burn's derive takes fields of other generics for constants.
struct TwoLayers<B: burn::tensor::backend::Backend> {
    first: Linear<B>,
    second: Linear<B>,
    /// No rank has a gradient for it.
    unused: Linear<B>,
}

/// Rank `rank`'s gradients: known values for `first` and `second`, none for `unused` (as for
/// a parameter the rank's shard never reached).
fn grads_of(model: &TwoLayers<B>, rank: usize) -> GradientsParams {
    let device = Default::default();
    let mut grads = GradientsParams::new();
    let values = |n: usize, salt: usize| -> Vec<f32> { (0..n).map(|i| ((i * 7 + salt * 5 + rank * 3) % 23) as f32 / 8.0 - 1.0).collect() };
    for (k, linear) in [&model.first, &model.second].into_iter().enumerate() {
        let [d_in, d_out] = linear.weight.val().dims();
        let w = Tensor::<Inner, 2>::from_data(TensorData::new(values(d_in * d_out, k), [d_in, d_out]), &device);
        grads.register::<Inner, 2>(linear.weight.id, w);
        let b = Tensor::<Inner, 1>::from_data(TensorData::new(values(d_out, k + 2), [d_out]), &device);
        grads.register::<Inner, 1>(linear.bias.as_ref().unwrap().id, b);
    }
    grads
}

/// The mean over `world` ranks of their gradients, flat.
fn expected(model: &TwoLayers<B>, world: usize) -> Vec<f32> {
    let all: Vec<Vec<f32>> = (0..world).map(|r| flat(&grads_of(model, r), model)).collect();
    (0..all[0].len()).map(|i| all.iter().map(|g| g[i]).sum::<f32>() / world as f32).collect()
}

fn flat(grads: &GradientsParams, model: &TwoLayers<B>) -> Vec<f32> {
    let mut out = Vec::new();
    for linear in [&model.first, &model.second] {
        let w = grads.get::<Inner, 2>(linear.weight.id).unwrap();
        out.extend(w.into_data().convert::<f32>().into_vec::<f32>().unwrap());
        let b = grads.get::<Inner, 1>(linear.bias.as_ref().unwrap().id).unwrap();
        out.extend(b.into_data().convert::<f32>().into_vec::<f32>().unwrap());
    }
    out
}

/// A linear layer with fixed weights, initialized now (a lazily initialized parameter would be
/// initialized once per clone, differently on each rank).
fn linear(d_in: usize, d_out: usize, device: &burn::tensor::Device<B>) -> Linear<B> {
    let values = |n: usize, salt: usize| -> Vec<f32> { (0..n).map(|i| ((i * 13 + salt) % 17) as f32 / 17.0 - 0.5).collect() };
    Linear {
        weight: Param::from_tensor(Tensor::from_data(TensorData::new(values(d_in * d_out, d_in), [d_in, d_out]), device)),
        bias: Some(Param::from_tensor(Tensor::from_data(TensorData::new(values(d_out, d_out), [d_out]), device))),
    }
}

fn run_ranks(world: usize, options: GradReduceOptions) -> (TwoLayers<B>, Vec<GradientsParams>, Vec<Vec<usize>>) {
    let device = Default::default();
    let model = TwoLayers::<B> {
        first: linear(4, 8, &device),
        second: linear(8, 2, &device),
        unused: linear(3, 3, &device),
    };
    let slots = Arc::new(Mutex::new(vec![Vec::new(); world]));
    let barrier = Arc::new(Barrier::new(world));
    let handles: Vec<_> = (0..world)
        .map(|rank| {
            let (model, slots, barrier) = (model.clone(), slots.clone(), barrier.clone());
            std::thread::spawn(move || {
                let group = ThreadGroup { rank, slots, barrier, calls: Mutex::new(Vec::new()) };
                let grads = grads_of(&model, rank);
                let reduced = reduce_gradients::<B, _>(&model, grads, &group, options).unwrap();
                (reduced, group.calls.into_inner().unwrap())
            })
        })
        .collect();
    let (grads, calls) = handles.into_iter().map(|h| h.join().unwrap()).unzip();
    (model, grads, calls)
}

#[test]
fn every_rank_gets_the_mean_of_the_ranks_gradients() {
    let (model, ranks, calls) = run_ranks(3, GradReduceOptions::default());
    let whole = expected(&model, 3);
    for grads in &ranks {
        let got = flat(grads, &model);
        assert_eq!(got.len(), whole.len());
        for (g, w) in got.iter().zip(&whole) {
            assert!((g - w).abs() <= 1e-6 * (1.0 + w.abs()), "{g} vs {w}");
        }
        // The unused layer gets zeros (every rank issued the same collectives).
        let unused = grads.get::<Inner, 2>(model.unused.weight.id).unwrap();
        assert!(unused.into_data().convert::<f32>().into_vec::<f32>().unwrap().iter().all(|&v| v == 0.0));
    }
    // One bucket: every parameter in one all-reduce.
    assert!(calls.iter().all(|c| c.len() == 1));
    assert_eq!(calls[0][0], 4 * 8 + 8 + 8 * 2 + 2 + 3 * 3 + 3);
}

#[test]
fn a_small_bucket_cap_splits_the_reduction_and_changes_nothing() {
    let options = GradReduceOptions { in_fp32: true, bucket_elements: 20 };
    let (model, ranks, calls) = run_ranks(2, options);
    let whole = expected(&model, 2);
    for grads in &ranks {
        for (g, w) in flat(grads, &model).iter().zip(&whole) {
            assert!((g - w).abs() <= 1e-6 * (1.0 + w.abs()), "{g} vs {w}");
        }
    }
    // first.weight 32 (alone, over the cap), first.bias 8 + second.weight 16 > 20: apart, ...
    assert_eq!(calls[0].len(), gradient_buckets::<B, _>(&model, options));
    assert!(calls[0].len() > 1);
    assert!(calls[0].iter().all(|&n| n <= 32));
    assert_eq!(calls[0], calls[1]);
}
