//! The MoE layer's expert-parallel path on NdArray (CI) and on wgpu (the CubeCL routing kernels;
//! skipped without a Vulkan adapter unless `LOWP_REQUIRE_WGPU=1`): on one rank (the loopback
//! exchange) it equals the plain layer, outputs and gradients; over two and four EP ranks
//! (threads as ranks, an in-process exchange between them) each rank's outputs equal the plain
//! layer's on its tokens, its experts' gradients the plain layer's gradients of the same experts
//! over every rank's tokens, and the ranks' router gradients sum to the plain one.

#[allow(dead_code, unused_macros, unused_imports)]
#[path = "modules/suite.rs"]
mod suite;

mod common;

use std::sync::{Arc, Barrier, Mutex};

use burn::backend::{Autodiff, NdArray};
use burn::tensor::backend::Backend;
use burn::tensor::{Distribution, Int, Tensor, TensorData};
use burn_lowp::backend::LowpBackend;
use burn_lowp::dist::token_exchange::host_counts;
use burn_lowp::dist::{DifferentiableAllToAll, ExpertSharding, LoopbackAllToAll, TokenAllToAll};
use burn_lowp::error::Result;
use burn_lowp::moe::{MoeLayer, MoeLayerConfig};
use common::seeded;


const HIDDEN: usize = 128;

fn floats<BB: burn::tensor::backend::Backend, const D: usize>(t: Tensor<BB, D>) -> Vec<f32> {
    t.into_data().convert::<f32>().into_vec().unwrap()
}

fn assert_close(got: &[f32], want: &[f32], tol: f32, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!((g - w).abs() <= tol * (1.0 + w.abs()), "{what}[{i}]: {g} vs {w}");
    }
}

/// Rows and counts exchanged between threads: each rank puts its part in, waits for the
/// others, takes what is addressed to it, and waits again before the slots are reused.
#[derive(Debug)]
struct Shared {
    rows: Mutex<Vec<(Vec<f32>, Vec<usize>)>>,
    counts: Mutex<Vec<Vec<usize>>>,
    barrier: Barrier,
}

#[derive(Debug)]
struct ThreadExchange {
    rank: usize,
    size: usize,
    shared: Arc<Shared>,
}

impl<B: Backend> TokenAllToAll<B> for ThreadExchange {
    fn ep_rank(&self) -> usize {
        self.rank
    }

    fn ep_size(&self) -> usize {
        self.size
    }

    fn gather_counts(&self, counts: Tensor<B, 1, Int>) -> Result<Vec<usize>> {
        self.shared.counts.lock().unwrap()[self.rank] = host_counts(counts)?;
        self.shared.barrier.wait();
        let all = self.shared.counts.lock().unwrap().concat();
        self.shared.barrier.wait();
        Ok(all)
    }

    fn all_to_all(&self, rows: Tensor<B, 2>, send: &[usize], recv: &[usize]) -> Result<Tensor<B, 2>> {
        let [n, hidden] = rows.dims();
        assert_eq!(n, send.iter().sum::<usize>());
        let device = rows.device();
        self.shared.rows.lock().unwrap()[self.rank] = (floats(rows), send.to_vec());
        self.shared.barrier.wait();
        let mut out = Vec::new();
        {
            let slots = self.shared.rows.lock().unwrap();
            for (peer, (data, peer_send)) in slots.iter().enumerate() {
                let start: usize = peer_send[..self.rank].iter().sum();
                let count = peer_send[self.rank];
                assert_eq!(count, recv[peer], "rank {} from {peer}", self.rank);
                out.extend_from_slice(&data[start * hidden..(start + count) * hidden]);
            }
        }
        self.shared.barrier.wait();
        let received = out.len() / hidden;
        Ok(Tensor::from_data(TensorData::new(out, [received, hidden]), &device))
    }
}

fn layer<B: LowpBackend>(experts: usize, shared: Option<usize>, device: &B::Device) -> MoeLayer<Autodiff<B>> {
    MoeLayerConfig::new(HIDDEN, 64, experts, 2)
        .with_shared_expert_ffn(shared)
        .init::<Autodiff<B>>(&suite::recipe("bf16.json"), device)
        .unwrap()
}

/// The output of `layer` on `x`, and the gradients of `sum(y * probe)`: x's, the experts' fc1
/// and fc2 weights', the router's.
struct Run {
    y: Vec<f32>,
    dx: Vec<f32>,
    dfc1: Vec<f32>,
    dfc2: Vec<f32>,
    drouter: Vec<f32>,
}

fn run<B: LowpBackend>(layer: &MoeLayer<Autodiff<B>>, x: Tensor<B, 2>, probe: Tensor<B, 2>, exchange: Option<&dyn TokenAllToAll<Autodiff<B>>>) -> Run {
    let x = Tensor::<Autodiff<B>, 2>::from_inner(x).require_grad();
    let (y, _) = match exchange {
        Some(e) => layer.forward_expert_parallel(x.clone(), None, e).unwrap(),
        None => layer.forward(x.clone(), None).unwrap(),
    };
    let grads = (y.clone() * Tensor::from_inner(probe)).sum().backward();
    let grad = |w: &Tensor<Autodiff<B>, 3>| floats(w.grad(&grads).unwrap());
    Run {
        y: floats(y.inner()),
        dx: floats(x.grad(&grads).unwrap()),
        dfc1: grad(&layer.experts.fc1.weight.val()),
        dfc2: grad(&layer.experts.fc2.weight.val()),
        drouter: floats(layer.router.weight.val().grad(&grads).unwrap()),
    }
}

fn one_rank_equals_the_plain_layer<B: LowpBackend>(device: &B::Device, tol: f32) {
    let exchange = DifferentiableAllToAll::<B>::new(Arc::new(LoopbackAllToAll));
    for shared in [None, Some(128)] {
        let layer = layer::<B>(8, shared, device);
        let x = Tensor::<B, 2>::random([24, HIDDEN], Distribution::Normal(0.0, 1.0), device);
        let probe = Tensor::<B, 2>::random([24, HIDDEN], Distribution::Normal(0.0, 1.0), device);
        let plain = run(&layer, x.clone(), probe.clone(), None);
        let ep = run(&layer, x, probe, Some(&exchange));
        assert_close(&ep.y, &plain.y, tol, "y");
        assert_close(&ep.dx, &plain.dx, tol, "dx");
        assert_close(&ep.dfc1, &plain.dfc1, tol, "fc1 weight gradient");
        assert_close(&ep.dfc2, &plain.dfc2, tol, "fc2 weight gradient");
        assert_close(&ep.drouter, &plain.drouter, tol, "router weight gradient");
    }
}

/// `ranks` EP ranks of one layer of 8 experts, each with its block of experts and a shard of
/// the tokens, against the plain layer on all tokens.
fn expert_parallel_matches_the_plain_layer<B: LowpBackend>(ranks: usize, device: &B::Device, tol: f32)
where
    MoeLayer<Autodiff<B>>: Send + 'static,
{
    let tokens_per_rank = 12;
    let full = layer::<B>(8, Some(128), device);
    let x = Tensor::<B, 2>::random([ranks * tokens_per_rank, HIDDEN], Distribution::Normal(0.0, 1.0), device);
    let probe = Tensor::<B, 2>::random([ranks * tokens_per_rank, HIDDEN], Distribution::Normal(0.0, 1.0), device);
    let plain = run(&full, x.clone(), probe.clone(), None);

    let sharding = ExpertSharding::new(8, ranks).unwrap();
    let shared = Arc::new(Shared {
        rows: Mutex::new(vec![(Vec::new(), Vec::new()); ranks]),
        counts: Mutex::new(vec![Vec::new(); ranks]),
        barrier: Barrier::new(ranks),
    });
    let recipe = suite::recipe("bf16.json");
    let handles: Vec<_> = (0..ranks)
        .map(|rank| {
            let mut mine = full.clone();
            mine.experts = full.experts.slice_experts(sharding.local_experts(rank).unwrap(), &recipe, "moe.experts").unwrap();
            let rows = rank * tokens_per_rank..(rank + 1) * tokens_per_rank;
            let x = x.clone().slice([rows.clone(), 0..HIDDEN]);
            let probe = probe.clone().slice([rows, 0..HIDDEN]);
            let exchange = DifferentiableAllToAll::<B>::new(Arc::new(ThreadExchange {
                rank,
                size: ranks,
                shared: shared.clone(),
            }));
            std::thread::spawn(move || run(&mine, x, probe, Some(&exchange)))
        })
        .collect();
    let results: Vec<Run> = handles.into_iter().map(|h| h.join().unwrap()).collect();

    let per_expert = |w: &[f32]| w.len() / 8;
    let mut drouter = vec![0.0; plain.drouter.len()];
    for (rank, r) in results.iter().enumerate() {
        let rows = rank * tokens_per_rank * HIDDEN..(rank + 1) * tokens_per_rank * HIDDEN;
        assert_close(&r.y, &plain.y[rows.clone()], tol, &format!("rank {rank} y"));
        assert_close(&r.dx, &plain.dx[rows], tol, &format!("rank {rank} dx"));
        let experts = sharding.local_experts(rank).unwrap();
        let (n1, n2) = (per_expert(&plain.dfc1), per_expert(&plain.dfc2));
        assert_close(&r.dfc1, &plain.dfc1[experts.start * n1..experts.end * n1], 10.0 * tol, &format!("rank {rank} fc1 weight gradient"));
        assert_close(&r.dfc2, &plain.dfc2[experts.start * n2..experts.end * n2], 10.0 * tol, &format!("rank {rank} fc2 weight gradient"));
        for (acc, g) in drouter.iter_mut().zip(&r.drouter) {
            *acc += g;
        }
    }
    assert_close(&drouter, &plain.drouter, 10.0 * tol, "router weight gradient summed over the ranks");
}

#[test]
fn the_expert_parallel_path_on_one_rank_equals_the_plain_layer() {
    let _seeded = seeded();
    one_rank_equals_the_plain_layer::<NdArray>(&Default::default(), 1e-6);
}

#[test]
fn two_expert_parallel_ranks_equal_the_plain_layer() {
    let _seeded = seeded();
    expert_parallel_matches_the_plain_layer::<NdArray>(2, &Default::default(), 1e-5);
}

#[test]
fn four_expert_parallel_ranks_equal_the_plain_layer() {
    let _seeded = seeded();
    expert_parallel_matches_the_plain_layer::<NdArray>(4, &Default::default(), 1e-5);
}

/// An expert-parallel rank's model is the one-GPU model of the same seed: every parameter
/// outside the experts equal, its experts the rank's block of the one-GPU experts (the
/// embedding, drawn lazily by Burn, once came from another place of the seeded stream).
#[test]
fn an_expert_parallel_rank_starts_from_the_one_gpu_weights() {
    let _seeded = seeded();
    use std::collections::HashSet;

    use burn::module::{Module, ModuleVisitor, Param, ParamId};
    use burn_lowp::moe::{MoeLm, MoeLmConfig};
    /// The values of the float parameters visited, in order, but those in `skip`.
    struct Values(Vec<Vec<f32>>, HashSet<ParamId>);
    impl<B: burn::tensor::backend::Backend> ModuleVisitor<B> for Values {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            if !self.1.contains(&param.id) {
                self.0.push(floats(param.val()));
            }
        }
    }
    fn values<M: Module<NdArray>>(m: &M, skip: HashSet<ParamId>) -> Vec<Vec<f32>> {
        let mut v = Values(Vec::new(), skip);
        m.visit(&mut v);
        v.0
    }
    let device = Default::default();
    let recipe = suite::recipe("bf16.json");
    let mut config = MoeLmConfig::new().with_num_layers(2);
    config.num_experts = 4;
    config.top_k = 2;
    <NdArray as Backend>::seed(&device, 7);
    let plain: MoeLm<NdArray> = config.init(&recipe, &device).unwrap();
    let (ep_size, ep_rank) = (2, 1);
    <NdArray as Backend>::seed(&device, 7);
    let ep: MoeLm<NdArray> = config.init_expert_parallel(&recipe, &device, ep_size, ep_rank).unwrap();
    assert_eq!(
        values(&ep, ep.expert_param_ids()),
        values(&plain, plain.expert_param_ids()),
        "the parameters outside the experts"
    );
    let per_rank = 4 / ep_size;
    for (i, (a, b)) in ep.layers.iter().zip(&plain.layers).enumerate() {
        let want = b.moe.experts.slice_experts(ep_rank * per_rank..(ep_rank + 1) * per_rank, &recipe, "want").unwrap();
        assert_eq!(values(&a.moe.experts, HashSet::new()), values(&want, HashSet::new()), "layer {i}'s experts");
    }
}

#[test]
fn a_layer_with_all_experts_refuses_an_expert_parallel_group() {
    let _seeded = seeded();
    let device = Default::default();
    let layer = layer::<NdArray>(8, None, &device);
    let shared = Arc::new(Shared {
        rows: Mutex::new(vec![(Vec::new(), Vec::new()); 2]),
        counts: Mutex::new(vec![Vec::new(); 2]),
        barrier: Barrier::new(2),
    });
    let exchange = DifferentiableAllToAll::<NdArray>::new(Arc::new(ThreadExchange { rank: 0, size: 2, shared }));
    let x = Tensor::<Autodiff<NdArray>, 2>::random([4, HIDDEN], Distribution::Normal(0.0, 1.0), &device);
    let err = layer.forward_expert_parallel(x, None, &exchange).unwrap_err().to_string();
    assert!(err.contains("local experts") && err.contains("init_expert_parallel"), "{err}");
}

/// The same on wgpu: the CubeCL routing kernels (sort, routes, dispatch, combine) under the
/// packed routes and the local experts' routes the expert-parallel path builds.
#[cfg(feature = "wgpu")]
mod wgpu {
    use burn_cubecl::CubeBackend;
    use burn_lowp_kernels::cubecl::wgpu::{WgpuDevice, WgpuRuntime};

    type Backend = CubeBackend<WgpuRuntime, f32, i32, u32>;

    fn device() -> Option<WgpuDevice> {
        crate::common::probe_device("wgpu", "LOWP_REQUIRE_WGPU", burn_lowp::backend::device::wgpu_available)
            .then(WgpuDevice::default)
    }

    #[test]
    fn the_expert_parallel_path_on_one_rank_equals_the_plain_layer_on_wgpu() {
        let _seeded = crate::common::seeded();
        if let Some(device) = device() {
            super::one_rank_equals_the_plain_layer::<Backend>(&device, 1e-5);
        }
    }

    #[test]
    fn two_expert_parallel_ranks_equal_the_plain_layer_on_wgpu() {
        let _seeded = crate::common::seeded();
        if let Some(device) = device() {
            super::expert_parallel_matches_the_plain_layer::<Backend>(2, &device, 1e-4);
        }
    }
}
