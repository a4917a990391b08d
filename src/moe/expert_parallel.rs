//! The MoE layer under expert parallelism (Megatron-Core's "alltoall" token dispatcher): each
//! rank of an EP group holds `E / ep` consecutive experts (`dist::ExpertSharding`) and the
//! router over all E (replicated); token rows travel to the rank that holds their expert and
//! back.
//!
//! Forward, on every rank of the group:
//! 1. the router over all E experts, as on one GPU;
//! 2. the `T·k` assignments' rows in packed order, sorted by global expert, without padding
//!    (`dispatch` through a one-group layout, its tail rows dropped): the rows for one EP rank
//!    are contiguous;
//! 3. every rank's per-expert counts all-gathered and read on the host (the one host read of
//!    the layer: NCCL takes the split sizes on the host), the splits (`AllToAllSplits::dispatch`);
//! 4. the rows all-to-all'd to their experts' ranks: they arrive ordered by source rank, then
//!    local expert;
//! 5. the local experts' aligned layout from the summed received counts, and the received rows
//!    dispatched into it at their local-expert-major places (`AllToAllSplits::expert_major_rows`,
//!    inverted: the received order to the experts' order and back is one gather each way, inside
//!    the dispatch and the combine the one-GPU layer already runs);
//! 6. the grouped SwiGLU experts on the local experts, the rows back in the received order (a
//!    combine with weight 1, exact), the reverse all-to-all, and the combine with the router
//!    weights, as on one GPU.
//!
//! Backward is the same ops' gradients; the two exchanges' gradients are the transposed
//! exchanges (`dist::DifferentiableAllToAll`). The expert weights' gradients hold the tokens of
//! the whole EP group; the training loop reduces them over the expert-data-parallel group.

use std::collections::HashSet;
use std::ops::Range;

use burn::module::{Module, ModuleVisitor, Param, ParamId};
use burn::tensor::backend::Backend;
use burn::tensor::{DType, Int, Tensor, TensorData};

use super::experts::{SwigluExperts, SwigluExpertsConfig};
use super::layer::{MoeAux, MoeLayer};
use super::model::{MoeLm, MoeLmConfig};
use crate::dist::{invert_permutation, AllToAllSplits, ExpertSharding, TokenAllToAll};
use crate::error::LowpError;
use crate::ops::token_routing::{combine, dispatch, token_routes, TokenRoutes};
use crate::ops::LowpLinear;
use crate::recipe::Recipe;

fn ints<B: Backend>(values: &[usize], device: &B::Device) -> Tensor<B, 1, Int> {
    let values: Vec<i64> = values.iter().map(|&v| v as i64).collect();
    let n = values.len();
    Tensor::from_data(TensorData::new(values, [n]), device)
}

/// The routes of the `n = T·k` assignments into their packed order sorted by expert, without
/// padding: the routes of a one-group layout of `n` rows (whose padding is all at the tail),
/// the tail dropped.
fn packed_routes<B: LowpLinear>(position: Tensor<B, 1, Int>, k: usize, device: &B::Device) -> Result<TokenRoutes<B::Quant>, LowpError> {
    let n = position.dims()[0];
    let whole = B::lowp_group_layout(ints::<B>(&[n], device).into_primitive(), n)?;
    let routes = token_routes::<B>(position, &whole, k)?;
    let head = |t| Tensor::<B::Quant, 1, Int>::from_primitive(t).slice([0..n]).into_primitive();
    Ok(TokenRoutes {
        tokens: routes.tokens,
        top_k: routes.top_k,
        rows: n,
        assignment_row: routes.assignment_row,
        row_assignment: head(routes.row_assignment),
        row_token: head(routes.row_token),
    })
}

impl<B: LowpLinear> MoeLayer<B> {
    /// `forward` with the experts spread over an expert-parallel group (`exchange`): this
    /// layer's `experts` are the rank's `E / ep` local experts, the router scores all `E`.
    /// With a one-rank group (`dist::LoopbackAllToAll`) it computes what `forward` does.
    pub fn forward_expert_parallel(
        &self,
        x: Tensor<B, 2>,
        is_first_microbatch: Option<bool>,
        exchange: &dyn TokenAllToAll<B>,
    ) -> Result<(Tensor<B, 2>, MoeAux<B>), LowpError> {
        let [tokens, hidden] = x.dims();
        let device = x.device();
        let k = self.router.top_k;
        let num_experts = self.router.weight.dims()[1];
        let sharding = ExpertSharding::new(num_experts, exchange.ep_size())?;
        let local_experts = self.experts.fc1.num_gemms();
        if local_experts != sharding.experts_per_rank {
            return Err(LowpError::shape(
                "local experts",
                local_experts,
                format!(
                    "an expert-parallel layer of {num_experts} experts over {} ranks holds {} a rank (MoeLmConfig::init_expert_parallel)",
                    sharding.ep_size, sharding.experts_per_rank
                ),
            ));
        }
        let routing = self.router.forward(x.clone())?;
        let routes = packed_routes::<B>(routing.position.clone(), k, &device)?;
        let sorted = dispatch(x.clone(), &routes)?;

        let counts = exchange.gather_counts(routing.tokens_per_expert.clone())?;
        let splits = AllToAllSplits::dispatch(&sharding, exchange.ep_rank(), &counts)?;
        let received = exchange.all_to_all(sorted, &splits.send, &splits.recv)?;
        let received_rows: usize = splits.recv.iter().sum();

        let y = if received_rows == 0 {
            // Nothing for this rank's experts; the (empty, tracked) rows still go back, so that
            // the backward exchanges run on every rank.
            received
        } else {
            let place = invert_permutation(&splits.expert_major_rows())?;
            let layout = self
                .experts
                .fc1
                .layout(ints::<B>(&splits.tokens_per_local_expert(), &device), received_rows)?;
            let local = token_routes::<B>(ints::<B>(&place, &device), &layout, 1)?;
            let y = self.experts.forward_aligned(dispatch(received, &local)?, &layout, is_first_microbatch)?;
            let one = Tensor::<B, 2>::ones([received_rows, 1], &device).cast(DType::F32);
            combine(y, one, &local)?
        };
        let back = exchange.all_to_all(y, &splits.recv, &splits.send)?;
        let y = combine(back, routing.weights, &routes)?;
        debug_assert_eq!(y.dims(), [tokens, hidden]);
        let aux = MoeAux {
            loss: routing.aux_loss + routing.z_loss,
            tokens_per_expert: routing.tokens_per_expert,
        };
        self.with_shared_expert(y, x, is_first_microbatch, aux)
    }
}

/// `t` in a buffer of its own, off the graph: a slice may be a view that would keep the whole
/// tensor (all experts) alive. Multiplying by one is exact.
fn owned<B: Backend, const D: usize>(t: Tensor<B, D>) -> Tensor<B, D> {
    t.detach().mul_scalar(1.0)
}

impl<B: Backend> SwigluExperts<B> {
    /// The experts `range` of these, as a module of their own (fresh low-precision state and
    /// caches; the weights sliced, so the same values).
    pub fn slice_experts(&self, range: Range<usize>, recipe: &Recipe, name: &str) -> Result<SwigluExperts<B>, LowpError> {
        let [_, out1, hidden] = self.fc1.weight.dims();
        let device = self.fc1.weight.device();
        let mut local = SwigluExpertsConfig::new(range.len(), hidden, out1 / 2)
            .with_bias(self.fc1.bias.is_some())
            .with_name(name.to_string())
            .with_fp8_scales(self.fc1.fp8_scales())
            .init::<B>(recipe, &device)?;
        for (mine, full) in [(&mut local.fc1, &self.fc1), (&mut local.fc2, &self.fc2)] {
            let [_, out, inp] = full.weight.dims();
            mine.weight = Param::from_tensor(owned(full.weight.val().slice([range.clone(), 0..out, 0..inp])));
            if let (Some(bias), Some(full_bias)) = (mine.bias.as_mut(), full.bias.as_ref()) {
                *bias = Param::from_tensor(owned(full_bias.val().slice([range.clone(), 0..out])));
            }
        }
        Ok(local)
    }
}

impl MoeLmConfig {
    /// The model of EP rank `ep_rank` of a group of `ep_size`: every MoE layer holds its block of
    /// `num_experts / ep_size` experts (`dist::ExpertSharding`), the rest is replicated. The
    /// model of all experts is drawn first, as `init` draws it, and this rank's experts kept, so
    /// that every EP size starts from the same global weights.
    pub fn init_expert_parallel<B: Backend>(
        &self,
        recipe: &Recipe,
        device: &B::Device,
        ep_size: usize,
        ep_rank: usize,
    ) -> Result<MoeLm<B>, LowpError> {
        let sharding = ExpertSharding::new(self.num_experts, ep_size)?;
        let range = sharding.local_experts(ep_rank)?;
        let mut model = self.init::<B>(recipe, device)?;
        if ep_size == 1 {
            return Ok(model);
        }
        for (i, layer) in model.layers.iter_mut().enumerate() {
            layer.moe.experts = layer.moe.experts.slice_experts(range.clone(), recipe, &format!("layers.{i}.moe.experts"))?;
        }
        Ok(model)
    }
}

/// Collects the ids of the parameters it visits.
struct ParamIds(HashSet<ParamId>);

impl<B: Backend> ModuleVisitor<B> for ParamIds {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        self.0.insert(param.id);
    }
}

impl<B: Backend> MoeLm<B> {
    /// The ids of the experts' parameters (every MoE layer's `experts`): under expert
    /// parallelism their gradients are reduced over the expert-data-parallel group, the other
    /// parameters' over the world.
    pub fn expert_param_ids(&self) -> HashSet<ParamId> {
        let mut ids = ParamIds(HashSet::new());
        for layer in &self.layers {
            layer.moe.experts.visit(&mut ids);
        }
        ids.0
    }
}
