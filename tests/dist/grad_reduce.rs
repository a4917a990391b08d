//! Data parallel gradient averaging (`dist::reduce_gradients`) with threads as ranks: each rank
//! takes its shard of a batch, the gradients averaged over a CPU stand-in for NCCL equal the
//! gradients of the whole batch on one rank.

use std::sync::{Arc, Barrier, Mutex};

use burn::backend::{Autodiff, NdArray};
use burn::module::Module;
use burn::nn::{Linear, LinearConfig};
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

#[derive(Module, Clone, Debug)]
struct TwoLayers<Bk: burn::tensor::backend::Backend> {
    first: Linear<Bk>,
    second: Linear<Bk>,
    /// Never used in the forward pass: no rank has a gradient for it.
    unused: Linear<Bk>,
}

fn batch(rows: std::ops::Range<usize>) -> (Tensor<B, 2>, Tensor<B, 2>) {
    let device = Default::default();
    let n = rows.len();
    let x: Vec<f32> = rows.clone().flat_map(|r| (0..4).map(move |c| ((r * 7 + c * 3) % 11) as f32 / 5.0 - 1.0)).collect();
    let y: Vec<f32> = rows.flat_map(|r| (0..2).map(move |c| ((r * 5 + c) % 7) as f32 / 3.0 - 1.0)).collect();
    (
        Tensor::from_data(TensorData::new(x, [n, 4]), &device),
        Tensor::from_data(TensorData::new(y, [n, 2]), &device),
    )
}

fn grads_of(model: &TwoLayers<B>, rows: std::ops::Range<usize>) -> GradientsParams {
    let (x, y) = batch(rows);
    let out = model.second.forward(model.first.forward(x).tanh());
    let loss = (out - y).powi_scalar(2).mean();
    GradientsParams::from_grads::<B, _>(loss.backward(), model)
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

fn run_ranks(world: usize, options: GradReduceOptions) -> (TwoLayers<B>, Vec<GradientsParams>, Vec<Vec<usize>>) {
    let device = Default::default();
    let model = TwoLayers::<B> {
        first: LinearConfig::new(4, 8).init(&device),
        second: LinearConfig::new(8, 2).init(&device),
        unused: LinearConfig::new(3, 3).init(&device),
    };
    let slots = Arc::new(Mutex::new(vec![Vec::new(); world]));
    let barrier = Arc::new(Barrier::new(world));
    let rows = 12 / world;
    let handles: Vec<_> = (0..world)
        .map(|rank| {
            let (model, slots, barrier) = (model.clone(), slots.clone(), barrier.clone());
            std::thread::spawn(move || {
                let group = ThreadGroup { rank, slots, barrier, calls: Mutex::new(Vec::new()) };
                let grads = grads_of(&model, rank * rows..(rank + 1) * rows);
                let reduced = reduce_gradients::<B, _>(&model, grads, &group, options).unwrap();
                (reduced, group.calls.into_inner().unwrap())
            })
        })
        .collect();
    let (grads, calls) = handles.into_iter().map(|h| h.join().unwrap()).unzip();
    (model, grads, calls)
}

#[test]
fn averaged_shard_gradients_equal_the_whole_batch_gradients() {
    let (model, ranks, calls) = run_ranks(3, GradReduceOptions::default());
    let whole = flat(&grads_of(&model, 0..12), &model);
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
    let whole = flat(&grads_of(&model, 0..12), &model);
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
