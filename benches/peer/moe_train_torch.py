"""PyTorch peer of `examples/moe_train.rs`: the same MoE language model, data, optimizer and
metrics, in the strongest PyTorch setups we know for it.

The model mirrors `src/moe/` (`model.rs`, `layer.rs`, `router.rs`, `experts.rs`): byte tokens ->
embedding -> N x (RMSNorm -> causal self-attention with RoPE, bias-free `nn.Linear` QKV and output
projections -> RMSNorm -> MoE) -> RMSNorm -> `lm_head` (or the embedding, tied). The router is
f32 (softmax top-k, weights not renormalized; or sigmoid with the aux-loss-free expert bias),
with the Switch load-balancing loss `coeff * E * sum_i f_i P_i` and the z-loss; the experts are
SwiGLU in torchtitan's layout (`w1`/`w3` gate/up `[E, ffn, hidden]`, `w2` `[E, hidden, ffn]`,
each used transposed by `torch._grouped_mm`), the token groups padded to multiples of 16 rows on
the device with no host read; an optional shared expert. Weights are BF16 except the router.
The same init distributions (N(0, `model.init_std`) for every weight matrix, the router's
included; RMSNorm gains 1), RMSNorm epsilon, RoPE table (f64, rounded
once), loss (mean cross-entropy in f32 plus the auxiliary losses; the LM loss is reported),
AdamW settings (epsilon included, every parameter decayed), warm-up + cosine schedule,
per-parameter gradient-norm clipping (Burn's `GradientClipping::Norm`, vectorised:
`torch._foreach_norm`, then `torch._foreach_mul_`), micro-batches, and the same data windows in
the same order (`moe_data.py`, checked against the Rust draw by `check_moe_data.py`).

Modes (`--mode`):
  eager    BF16, eager PyTorch (label `pytorch-bf16-eager`).
  compile  BF16, each decoder layer and the loss (final norm, head, cross-entropy) compiled with
           `torch.compile`, as torchtitan compiles per block; embedding and the fused AdamW stay
           eager (`pytorch-bf16-compile`).
  fp8      `compile` plus torchao 0.18 FP8 training (`pytorch-fp8-torchao`): the experts'
           grouped GEMMs rowwise FP8 (`torchao.quantization.quantize_` with
           `torchao.prototype.moe_training.config.Float8TrainingOpConfig`, recipe
           `Float8TrainingRecipe.FP8_ROWWISE`), every `nn.Linear` (attention QKV and output
           projections, the shared expert, `lm_head`) tensorwise FP8
           (`torchao.float8.convert_to_float8_training`, `Float8LinearConfig` "tensorwise").
           torchao travels to the GPU machine as a wheel in `.whl/`.

Metrics as the Rust run reports them: `final_loss` is the mean training (LM) loss of the last
10 % of steps, `eval_loss` the mean LM loss of the 8 held-out batches after training,
`tokens_per_s` and `step_ms` over the log intervals after the first (compilation and autotuning
fall in the first), `peak_memory_bytes` the caching allocator's peak reservation. One JSON line
goes to stdout; `--out` writes it with every step's losses.

    python3 benches/peer/moe_train_torch.py --config configs/moe-235m.json --data corpus.txt --mode compile --steps 300 --seed 7 --out x.json

`--steps` and `--seed` override the config's `train.steps` and `train.seed`; without `--data` the
run trains on the built-in corpus, as the Rust example does. `--fp8-head-bf16` keeps `lm_head`
in BF16 in fp8 mode (torchtitan's habit). `--profile PATH` profiles a few more steps after the run
and writes the kernel table there. `--device cpu` is for smoke tests of eager and compile modes.

Where the twin differs from ours: PyTorch's fused AdamW keeps its moments in the parameters'
dtype (BF16; ours f32) and the clipped gradient is rounded to its dtype before the step (ours
stays f32); attention is SDPA's fused kernel (its probabilities stay f32 on chip, ours are
rounded to BF16 once); the embedding is a gather (ours a one-hot product, the same forward);
expert groups are padded to 16 rows (ours 128, the same numbers); the FP8 recipes are torchao's
(rowwise experts with power-of-2 scales, tensorwise linears), not ours; runs are not
bit-reproducible from run to run.
"""
import argparse
import json
import math
import os
import struct
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.dont_write_bytecode = True  # no __pycache__ beside the scripts
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import moe_data  # noqa: E402

# Token groups of the grouped GEMMs are padded to multiples of this many rows (the FP8 grouped
# GEMM's requirement; the BF16 runs use the same layout).
ALIGN = 16
# Held-out batches evaluated after training (`EVAL_BATCHES` of `src/moe/train.rs`).
EVAL_BATCHES = 8
# Step of the aux-loss-free expert bias (sigmoid scoring): `RouterConfig::bias_update_rate`.
BIAS_UPDATE_RATE = 1e-3

# The run config's fields and defaults (`MoeLmConfig` and `TrainConfig`).
MODEL_DEFAULTS = {
    "vocab_size": 256, "hidden_size": 128, "num_layers": 2, "num_heads": 4,
    "ffn_hidden_size": 128, "num_experts": 8, "top_k": 2, "score_function": "softmax",
    "aux_loss_coeff": 1e-2, "z_loss_coeff": 0.0, "shared_expert_ffn": None, "max_seq_len": 1024,
    "rope_theta": 10000.0, "norm_eps": 1e-5, "tie_embeddings": False, "init_std": 0.02,
    # Our FP8 per-tensor scales of the experts (per expert or shared): a choice of our recipes
    # with no counterpart here (torchao's expert GEMMs are rowwise); accepted and ignored.
    "expert_fp8_scales": "per_group",
}
TRAIN_DEFAULTS = {
    "steps": 300, "batch_size": 8, "seq_len": 64, "micro_batches": 1, "lr": 3e-3,
    "warmup_steps": 30, "min_lr_ratio": 0.1, "weight_decay": 0.1, "beta1": 0.9, "beta2": 0.95,
    "adam_eps": 1e-8, "grad_clip_norm": 1.0, "seed": 42, "log_every": 10,
    # Checkpoints: none here.
    "checkpoint_every": 0,
}
LABELS = {"eager": "pytorch-bf16-eager", "compile": "pytorch-bf16-compile", "fp8": "pytorch-fp8-torchao"}


def f32(x):
    """`x` rounded to f32, as our config stores it."""
    return struct.unpack("f", struct.pack("f", x))[0]


def fail(message):
    raise SystemExit(f"moe_train_torch: {message}")


def load_config(path):
    """The run config with defaults, checked as `RunConfig::from_json` checks it."""
    given = {}
    if path:
        with open(path) as f:
            given = json.load(f)
    if not isinstance(given, dict):
        fail("run config: must be a JSON object")
    sections = {"model": dict(MODEL_DEFAULTS), "train": dict(TRAIN_DEFAULTS)}
    for name, section in given.items():
        if name not in sections:
            fail(f'{name}: unknown section; a run config has the sections "model" and "train"')
        if not isinstance(section, dict):
            fail(f"{name}: must be a JSON object")
        for key, value in section.items():
            if key not in sections[name]:
                fail(f"{name}.{key}: unknown field; known fields: {', '.join(sorted(sections[name]))}")
            sections[name][key] = value
    m, t = sections["model"], sections["train"]
    for key in ("vocab_size", "hidden_size", "num_layers", "num_heads", "ffn_hidden_size",
                "num_experts", "max_seq_len"):
        if not (isinstance(m[key], int) and m[key] > 0):
            fail(f"model.{key}: {m[key]}: must be a positive integer")
    if m["hidden_size"] % m["num_heads"] or (m["hidden_size"] // m["num_heads"]) % 2:
        fail("model.hidden_size / num_heads: the head size must be a whole, even number (RoPE)")
    if not 1 <= m["top_k"] <= m["num_experts"]:
        fail(f"model.top_k: {m['top_k']}: must be between 1 and num_experts")
    if m["score_function"] not in ("softmax", "sigmoid"):
        fail(f"model.score_function: {m['score_function']!r}: must be softmax or sigmoid")
    if m["expert_fp8_scales"] not in ("per_group", "shared"):
        fail(f"model.expert_fp8_scales: {m['expert_fp8_scales']!r}: must be per_group or shared")
    if m["shared_expert_ffn"] is not None and not (isinstance(m["shared_expert_ffn"], int)
                                                   and m["shared_expert_ffn"] > 0):
        fail(f"model.shared_expert_ffn: {m['shared_expert_ffn']}: must be a positive integer or null")
    if not (m["init_std"] > 0 and m["norm_eps"] > 0 and m["rope_theta"] > 0):
        fail("model.init_std / norm_eps / rope_theta: must be positive")
    for key in ("steps", "batch_size", "seq_len", "micro_batches", "log_every"):
        if not (isinstance(t[key], int) and t[key] > 0):
            fail(f"train.{key}: {t[key]}: must be a positive integer")
    if t["batch_size"] % t["micro_batches"]:
        fail(f"train.micro_batches: {t['micro_batches']}: must divide batch_size = {t['batch_size']}")
    if not (t["adam_eps"] > 0 and math.isfinite(t["adam_eps"])):
        fail(f"train.adam_eps: {t['adam_eps']}: must be positive and finite")
    if not (t["lr"] > 0 and 0 <= t["min_lr_ratio"] <= 1):
        fail("train.lr / min_lr_ratio: lr must be positive and min_lr_ratio in [0, 1]")
    if t["seq_len"] > m["max_seq_len"]:
        fail(f"train.seq_len: {t['seq_len']}: must not exceed model.max_seq_len = {m['max_seq_len']}")
    return m, t


def learning_rate(t, step):
    """`TrainConfig::learning_rate`: linear warm-up, then cosine decay to `min_lr_ratio * lr`."""
    if step < t["warmup_steps"]:
        return t["lr"] * (step + 1) / t["warmup_steps"]
    decay = max(t["steps"] - t["warmup_steps"], 1)
    progress = min((step - t["warmup_steps"]) / decay, 1.0)
    cosine = 0.5 * (1.0 + math.cos(math.pi * progress))
    return t["lr"] * (t["min_lr_ratio"] + (1.0 - t["min_lr_ratio"]) * cosine)


def rope_table(seq_len, head, theta, device):
    """cos and sin `[seq_len, head / 2]` of `position * theta^(-2i / head)`, computed in f64 and
    rounded to f32 then BF16, as `src/nn/rotary.rs` builds our table (theta an f32)."""
    theta = f32(theta)
    i = torch.arange(head // 2, dtype=torch.float64)
    freq = torch.exp(-(2 * i) / head * math.log(theta))
    angle = torch.arange(seq_len, dtype=torch.float64)[:, None] * freq[None]
    to = lambda a: a.to(torch.float32).to(torch.bfloat16).to(device)
    return to(angle.cos()), to(angle.sin())


def rope(u, cos, sin):
    """Rotates the pairs `(2i, 2i + 1)` of `u [batch, heads, seq, head]` (Burn's
    `RotaryEncoding` convention) in f32, rounded once to `u`'s dtype."""
    pairs = u.float().unflatten(-1, (-1, 2))
    a, b = pairs[..., 0], pairs[..., 1]
    c, s = cos.float(), sin.float()
    return torch.stack((a * c - b * s, a * s + b * c), -1).flatten(-2).to(u.dtype)


def grouped_mm(x, w, offs):
    """`x [rows, in]` times each group's `w[g] [out, in]` transposed: `torch._grouped_mm` with
    torchtitan's weight layout. (torchao's FP8 weights intercept this call.)"""
    return torch._grouped_mm(x, w.transpose(-2, -1), offs=offs)


def normal_(t, std):
    with torch.no_grad():
        t.normal_(0.0, std)
    return t


class Attention(nn.Module):
    """`CausalSelfAttention`: QKV rows `[q | k | v]`, each `heads` heads; RoPE on q and k;
    causal softmax attention scaled by `1/sqrt(head)` (SDPA's fused kernels on the GPU)."""

    def __init__(self, h, heads, std, dtype, device):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(h, 3 * h, bias=False, dtype=dtype, device=device)
        self.proj = nn.Linear(h, h, bias=False, dtype=dtype, device=device)
        normal_(self.qkv.weight, std)
        normal_(self.proj.weight, std)

    def forward(self, x, cos, sin):
        b, s, h = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, self.heads, h // self.heads).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(rope(q, cos, sin), rope(k, cos, sin), v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, s, h))


class Router(nn.Module):
    """`Router`: f32 scores of every expert for every token, the top-k choice, the mixing weights
    and the load-balancing losses (`src/moe/router.rs`)."""

    def __init__(self, h, experts, top_k, score_function, aux_coeff, z_coeff, std, device):
        super().__init__()
        # `[hidden, experts]`, f32.
        self.weight = nn.Parameter(normal_(torch.empty(h, experts, device=device), std))
        self.top_k, self.score_function = top_k, score_function
        self.aux_coeff, self.z_coeff = aux_coeff, z_coeff
        # The aux-loss-free balancing bias (sigmoid scoring): state, not trained.
        self.register_buffer("expert_bias", torch.zeros(experts, device=device)
                             if score_function == "sigmoid" else None)

    def forward(self, x):
        """`x [T, hidden]` -> chosen experts `[T, k]` (best first), their weights `[T, k]` f32,
        assignments per expert `[E]` and the auxiliary loss (f32 scalar)."""
        tokens, experts = x.shape[0], self.weight.shape[1]
        logits = x.float() @ self.weight
        if self.score_function == "softmax":
            scores = torch.softmax(logits, -1)
        else:
            scores = torch.sigmoid(logits)
        selection = scores.detach()
        if self.expert_bias is not None:
            selection = selection + self.expert_bias
        index = selection.topk(self.top_k, -1).indices
        weights = scores.gather(1, index)
        if self.score_function == "sigmoid":
            weights = weights / weights.sum(-1, keepdim=True)
        flat = index.reshape(-1)
        # Assignments per expert on the device (`bincount` would read its length on the host).
        counts = torch.zeros(experts, dtype=torch.int64, device=x.device).scatter_add_(
            0, flat, torch.ones_like(flat))
        aux = logits.new_zeros(())
        if self.aux_coeff > 0:
            fraction = counts.float() / (tokens * self.top_k)
            mean_score = scores.sum(0) / tokens
            aux = aux + (fraction * mean_score).sum() * (self.aux_coeff * experts)
        if self.z_coeff > 0:
            aux = aux + torch.logsumexp(logits, -1).square().mean() * self.z_coeff
        return index, weights, counts, aux

    @torch.no_grad()
    def update_expert_bias(self, load):
        """DeepSeek-V3's aux-loss-free balancing, `b_i += rate * sign(mean(load) - load_i)`, with
        the step's loads (summed over micro-batches)."""
        if self.expert_bias is not None:
            load = load.float()
            self.expert_bias += BIAS_UPDATE_RATE * torch.sign(load.mean() - load)


class GroupedExperts(nn.Module):
    """SwiGLU experts in torchtitan's layout: `w2(silu(w1 x) * (w3 x))` per expert. Our
    `experts.fc1` weight `[E, 2 ffn, hidden]` is `[w1; w3]` (gate rows first: `fused::swiglu`
    takes `silu(first half) * second half`), `experts.fc2` `[E, hidden, ffn]` is `w2`."""

    def __init__(self, experts, h, ffn, std, dtype, device):
        super().__init__()
        w = lambda *shape: nn.Parameter(normal_(torch.empty(*shape, dtype=dtype, device=device), std))
        self.w1 = w(experts, ffn, h)
        self.w2 = w(experts, h, ffn)
        self.w3 = w(experts, ffn, h)

    def forward(self, x, offs):
        """`x [rows, hidden]`, expert g's rows ending at `offs[g]`."""
        gate = grouped_mm(x, self.w1, offs)
        up = grouped_mm(x, self.w3, offs)
        # SwiGLU in f32, rounded once (as ours).
        h = (F.silu(gate.float()) * up.float()).to(x.dtype)
        return grouped_mm(h, self.w2, offs)


class SharedExpert(nn.Module):
    """`SwigluMlp`: a SwiGLU MLP of bias-free `Linear`s every token goes through; `fc1` writes
    `[gate | up]`."""

    def __init__(self, h, ffn, std, dtype, device):
        super().__init__()
        self.fc1 = nn.Linear(h, 2 * ffn, bias=False, dtype=dtype, device=device)
        self.fc2 = nn.Linear(ffn, h, bias=False, dtype=dtype, device=device)
        normal_(self.fc1.weight, std)
        normal_(self.fc2.weight, std)

    def forward(self, x):
        gate, up = self.fc1(x).float().chunk(2, -1)
        return self.fc2((F.silu(gate) * up).to(x.dtype))


class MoeLayer(nn.Module):
    """`MoeLayer`: router -> dispatch into the experts' padded batch (on the device) -> experts
    -> combine with the router weights in f32 (+ the shared expert). Dropless."""

    def __init__(self, m, dtype, device):
        super().__init__()
        h, e = m["hidden_size"], m["num_experts"]
        self.router = Router(h, e, m["top_k"], m["score_function"], m["aux_loss_coeff"],
                             m["z_loss_coeff"], m["init_std"], device)
        self.experts = GroupedExperts(e, h, m["ffn_hidden_size"], m["init_std"], dtype, device)
        self.shared = (SharedExpert(h, m["shared_expert_ffn"], m["init_std"], dtype, device)
                       if m["shared_expert_ffn"] else None)

    def forward(self, x):
        """`x [T, hidden]` -> `[T, hidden]`, the auxiliary loss and the loads `[E]`."""
        tokens, hidden = x.shape
        index, weights, counts, aux = self.router(x)
        k, experts = index.shape[1], counts.shape[0]
        assignments = tokens * k
        # Each expert's group padded to a multiple of ALIGN rows, at least ALIGN (torchtitan's
        # `generate_permute_indices` layout): the padded batch has a static size, so nothing is
        # read on the host and compiled graphs keep their shapes. Rows past the last group are
        # never computed (the grouped GEMMs stop at `offs[-1]`) and never read back.
        rows = -(-(assignments + experts * ALIGN) // ALIGN) * ALIGN
        padded = (counts.clamp(min=ALIGN) + (ALIGN - 1)) // ALIGN * ALIGN
        padded_end = padded.cumsum(0)
        offs = padded_end.to(torch.int32)
        padded_start = padded_end - padded
        start = counts.cumsum(0) - counts
        flat = index.reshape(-1)  # assignment a = t * k + j
        order = flat.argsort(stable=True)  # assignments by expert
        expert = flat[order]
        rank = torch.arange(assignments, device=x.device) - start[expert]
        # The padded row of each assignment, and the token of each padded row (`tokens`: the
        # zero row appended to x, for padding).
        position = torch.empty_like(order).scatter_(0, order, padded_start[expert] + rank)
        source = torch.full((rows,), tokens, dtype=torch.int64, device=x.device).scatter_(
            0, position, torch.arange(assignments, device=x.device) // k)
        batch = torch.cat((x, x.new_zeros(1, hidden)))[source]
        y = self.experts(batch, offs)
        out = (y[position].view(tokens, k, hidden).float() * weights.unsqueeze(-1)).sum(1)
        if self.shared is not None:
            out = out + self.shared(x).float()
        return out, aux, counts


class DecoderLayer(nn.Module):
    def __init__(self, m, dtype, device):
        super().__init__()
        h = m["hidden_size"]
        self.attention_norm = nn.RMSNorm(h, eps=m["norm_eps"], dtype=dtype, device=device)
        self.attention = Attention(h, m["num_heads"], m["init_std"], dtype, device)
        self.moe_norm = nn.RMSNorm(h, eps=m["norm_eps"], dtype=dtype, device=device)
        self.moe = MoeLayer(m, dtype, device)

    def forward(self, x, cos, sin):
        """`x [batch, seq, hidden]` -> the same, the layer's auxiliary loss and loads."""
        x = x + self.attention(self.attention_norm(x), cos, sin)
        y, aux, counts = self.moe(self.moe_norm(x).flatten(0, 1))
        return x + y.to(x.dtype).view_as(x), aux, counts


class MoeLm(nn.Module):
    def __init__(self, m, seq_len, dtype, device):
        super().__init__()
        h, v = m["hidden_size"], m["vocab_size"]
        self.embedding = nn.Embedding(v, h, dtype=dtype, device=device)
        normal_(self.embedding.weight, m["init_std"])
        self.layers = nn.ModuleList(DecoderLayer(m, dtype, device) for _ in range(m["num_layers"]))
        self.norm = nn.RMSNorm(h, eps=m["norm_eps"], dtype=dtype, device=device)
        self.lm_head = None
        if not m["tie_embeddings"]:
            self.lm_head = nn.Linear(h, v, bias=False, dtype=dtype, device=device)
            normal_(self.lm_head.weight, m["init_std"])
        cos, sin = rope_table(seq_len, h // m["num_heads"], m["rope_theta"], device)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)
        self.head_loss = self._head_loss

    def _head_loss(self, x, targets):
        """Mean next-token cross-entropy of the final norm's logits, in f32. A tied head is the
        embedding matrix in BF16 (ours: in high precision, not quantized)."""
        x = self.norm(x)
        logits = self.lm_head(x) if self.lm_head is not None else x @ self.embedding.weight.t()
        return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())

    def forward(self, tokens, targets):
        """LM loss, the layers' auxiliary losses summed (what the optimizer minimises is their
        sum) and the loads of every layer `[layers, E]`."""
        x = self.embedding(tokens)
        aux, loads = 0.0, []
        for layer in self.layers:
            x, a, counts = layer(x, self.cos, self.sin)
            aux = aux + a
            loads.append(counts)
        return self.head_loss(x, targets), aux, torch.stack(loads)


def to_fp8(model, keep_head_bf16):
    """torchao FP8 training: rowwise FP8 grouped GEMMs for the experts, tensorwise FP8 for every
    `nn.Linear` (attention, shared expert and, as our FP8 recipes, `lm_head`)."""
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training
    from torchao.prototype.moe_training.config import Float8TrainingOpConfig, Float8TrainingRecipe
    from torchao.quantization import quantize_

    for fqn, mod in model.named_modules():
        if isinstance(mod, GroupedExperts) and any(d % 16 for d in mod.w2.shape[1:]):
            fail(f"{fqn}: FP8 grouped GEMMs need hidden_size and ffn_hidden_size divisible by 16")
    # The experts' w1/w2/w3 become `Float8TrainingWeightWrapperTensor`s, which route
    # `torch._grouped_mm` to torchao's dynamic rowwise FP8 scaled grouped GEMM (groups of a
    # multiple of 16 rows: our padding).
    quantize_(model, Float8TrainingOpConfig.from_recipe(Float8TrainingRecipe.FP8_ROWWISE),
              filter_fn=lambda mod, fqn: isinstance(mod, GroupedExperts))
    kept = []

    def linear_filter(mod, fqn):
        if not isinstance(mod, nn.Linear):
            return False
        if (keep_head_bf16 and fqn == "lm_head") or mod.in_features % 16 or mod.out_features % 16:
            kept.append(fqn)
            return False
        return True

    convert_to_float8_training(model, module_filter_fn=linear_filter,
                               config=Float8LinearConfig.from_recipe_name("tensorwise"))
    if kept:
        print(f"peer: kept in BF16: {', '.join(kept)}", file=sys.stderr)


def clip_per_parameter(grads, max_norm):
    """Burn's `GradientClipping::Norm` on each parameter's gradient on its own: `g *= min(1,
    c / (||g|| + tiny))` (`tiny` the smallest normal of the gradient's dtype), the norms taken in
    f32. Vectorised per dtype: one `_foreach_norm`, the coefficients as one tensor, then
    `_foreach_mul_`."""
    by_dtype = {}
    for g in grads:
        by_dtype.setdefault(g.dtype, []).append(g)
    for dtype, group in by_dtype.items():
        norms = torch.stack(torch._foreach_norm(group, 2.0, dtype=torch.float32))
        coef = (max_norm / (norms + torch.finfo(dtype).tiny)).clamp_(max=1.0)
        torch._foreach_mul_(group, list(coef.unbind(0)))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", help="run config (JSON); default: the built-in defaults")
    p.add_argument("--data", help="UTF-8 text to train on; default: the built-in corpus")
    p.add_argument("--mode", choices=("eager", "compile", "fp8"), default="eager")
    p.add_argument("--steps", type=int, help="overrides train.steps")
    p.add_argument("--seed", type=int, help="overrides train.seed (weights and data order)")
    p.add_argument("--out", help="write the result with every step's losses here (JSON)")
    p.add_argument("--label", help="label of the result (default: by mode)")
    p.add_argument("--fp8-head-bf16", action="store_true",
                   help="fp8 mode: keep lm_head in BF16 (our FP8 recipes quantize it)")
    p.add_argument("--profile", help="after the run: profile a few more steps, write a kernel "
                   "table here")
    p.add_argument("--profile-steps", type=int, default=3)
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                   help="cpu: a smoke test of eager mode only")
    args = p.parse_args()
    m, t = load_config(args.config)
    if args.steps is not None:
        if args.steps <= 0:
            fail(f"--steps {args.steps}: must be positive")
        t["steps"] = args.steps
    if args.seed is not None:
        t["seed"] = args.seed
    if args.device == "cpu" and args.mode == "fp8":
        fail("--mode fp8 needs a CUDA device (FP8 tensor cores)")
    if args.device == "cuda" and not torch.cuda.is_available():
        fail("no CUDA device (--device cpu runs a smoke test)")
    device, dtype = torch.device(args.device), torch.bfloat16
    steps, micro, seq = t["steps"], t["micro_batches"], t["seq_len"]
    rows = t["batch_size"] // micro
    label = args.label or LABELS[args.mode]

    data, source = moe_data.load(args.data)
    moe_data.check_fits(len(data), seq, source)
    train_text, held_out = moe_data.split(data)
    to_device = lambda b: torch.frombuffer(bytearray(b), dtype=torch.uint8).to(device)
    train_gpu, held_gpu = to_device(train_text), to_device(held_out)
    # Every window start of the run, drawn as `Corpus::batch` draws them, uploaded once:
    # `[steps, micro-batches, rows]`; a micro-batch's tokens are one gather on the device.
    starts = torch.tensor(
        [[moe_data.train_starts(t["seed"], s, mb, rows, seq, len(train_text)) for mb in range(micro)]
         for s in range(steps)], dtype=torch.int64, device=device)
    eval_starts = torch.tensor(
        [moe_data.eval_starts(i, rows, seq, len(held_out)) for i in range(EVAL_BATCHES)],
        dtype=torch.int64, device=device)
    span = torch.arange(seq + 1, device=device)

    def window(text, at):
        w = text[at[:, None] + span].long()
        return w[:, :-1], w[:, 1:]

    torch.manual_seed(t["seed"])
    model = MoeLm(m, seq, dtype, device)
    num_params = sum(q.numel() for q in model.parameters())
    if args.mode == "fp8":
        to_fp8(model, args.fp8_head_bf16)
    if args.mode in ("compile", "fp8"):
        # Per block, as torchtitan: one graph per decoder layer (the layers share it), and the
        # loss; the step's Python (micro-batches, clipping, optimizer) stays eager.
        torch._dynamo.config.cache_size_limit = max(64, 4 * m["num_layers"])
        for layer in model.layers:
            layer.compile(dynamic=False)
        model.head_loss = torch.compile(model._head_loss, dynamic=False)
    params = [q for q in model.parameters() if q.requires_grad]
    # Every parameter decays, as Burn's AdamW; betas, epsilon and decay are f32 in our config.
    opt = torch.optim.AdamW(params, lr=t["lr"], betas=(f32(t["beta1"]), f32(t["beta2"])),
                            eps=f32(t["adam_eps"]), weight_decay=f32(t["weight_decay"]),
                            fused=device.type == "cuda")
    clip = None if t["grad_clip_norm"] is None else f32(t["grad_clip_norm"])
    routers = [layer.moe.router for layer in model.layers]
    print(f"peer: {label}: {m['num_layers']} layers, hidden {m['hidden_size']}, "
          f"{m['num_experts']} experts (top-{m['top_k']}), {num_params} parameters, data: {source} "
          f"({len(data)} bytes), {t['batch_size'] * seq} tokens/step", file=sys.stderr)

    def train_step(step):
        """One optimizer step on step `step`'s windows: the LM and auxiliary losses (on the
        device) and each layer's loads."""
        for group in opt.param_groups:
            group["lr"] = learning_rate(t, step)
        step_loss = step_aux = 0.0
        loads = None
        for mb in range(micro):
            tokens, targets = window(train_gpu, starts[step, mb])
            lm_loss, aux, layer_loads = model(tokens, targets)
            ((lm_loss + aux) / micro).backward()
            step_loss = step_loss + lm_loss.detach() / micro
            step_aux = step_aux + aux.detach() / micro
            loads = layer_loads if loads is None else loads + layer_loads
        for router, load in zip(routers, loads):
            router.update_expert_bias(load)
        if clip is not None:
            clip_per_parameter([q.grad for q in params if q.grad is not None], clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return step_loss, step_aux, loads

    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    losses, aux_losses, pending, intervals = [], [], [], []
    last_loads = None
    interval_start = time.perf_counter()
    for step in range(steps):
        step_loss, step_aux, loads = train_step(step)
        pending.append(torch.stack((step_loss, step_aux)))
        done = step + 1
        if done % t["log_every"] == 0 or done == steps:
            # The interval's one synchronisation: its losses come to the host together.
            values = torch.stack(pending).tolist()
            seconds = time.perf_counter() - interval_start
            intervals.append((len(values), seconds))
            losses += [v[0] for v in values]
            aux_losses += [v[1] for v in values]
            pending = []
            bad = [v for v in losses[-len(values):] if not math.isfinite(v)]
            if bad:
                fail(f"{label} training loss {bad[0]}: became non-finite by step {done}")
            print(f"peer: step {done}/{steps}: loss {losses[-1]:.4f}, "
                  f"{len(values) * t['batch_size'] * seq / seconds:.0f} tok/s, "
                  f"{1e3 * seconds / len(values):.1f} ms/step", file=sys.stderr)
            interval_start = time.perf_counter()
        if done == steps:
            last_loads = loads.sum(0).tolist()
    peak_reserved = torch.cuda.max_memory_reserved() if cuda else None
    peak_allocated = torch.cuda.max_memory_allocated() if cuda else None

    # Held-out loss as `train.rs` evaluates: the training forward pass (graph dropped), LM loss.
    eval_losses = []
    for i in range(EVAL_BATCHES):
        tokens, targets = window(held_gpu, eval_starts[i])
        eval_losses.append(model(tokens, targets)[0].detach())
    eval_loss = torch.stack(eval_losses).mean().item()

    if args.profile:
        # After the measured run and its evaluation: a few more steps (the last step's windows
        # again) under the profiler, their kernels summed by name.
        from torch.profiler import ProfilerActivity, profile
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
        with profile(activities=activities) as prof:
            for _ in range(args.profile_steps):
                train_step(steps - 1)
            if cuda:
                torch.cuda.synchronize()
        sort = "cuda_time_total" if cuda else "cpu_time_total"
        with open(args.profile, "w") as f:
            f.write(f"{label}: {args.profile_steps} steps\n")
            f.write(prof.key_averages().table(sort_by=sort, row_limit=60, max_name_column_width=90))

    timed = intervals[1:] if len(intervals) > 1 else intervals
    timed_steps, timed_seconds = sum(n for n, _ in timed), sum(s for _, s in timed)
    tail = max(1, len(losses) // 10)
    result = {
        "label": label, "mode": args.mode, "device": torch.cuda.get_device_name() if cuda else "cpu",
        "torch": torch.__version__, "num_params": num_params, "steps": steps,
        "final_loss": sum(losses[-tail:]) / tail, "eval_loss": eval_loss,
        "tokens_per_s": timed_steps * t["batch_size"] * seq / max(timed_seconds, 1e-9),
        "step_ms": 1e3 * timed_seconds / max(timed_steps, 1),
        "peak_memory_bytes": peak_reserved, "peak_allocated_bytes": peak_allocated,
        "last_loads": last_loads,
    }
    if args.mode == "fp8":
        import torchao
        result["torchao"] = torchao.__version__
    print(json.dumps(result))
    if args.out:
        with open(args.out, "w") as f:
            json.dump({**result, "losses": losses, "aux_losses": aux_losses}, f)


if __name__ == "__main__":
    main()
