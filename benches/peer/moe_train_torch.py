"""PyTorch peer of `examples/moe_train/`: the same MoE language model (byte tokens, RMSNorm,
RoPE attention with bias-free QKV/output projections, softmax top-k router in f32 with the
Switch load-balancing loss, SwiGLU experts by `torch._grouped_mm`, untied head), the same AdamW
settings, warm-up + cosine schedule and run config file, in BF16 (weights and activations, f32
router and loss) and eager mode. It measures tokens/s over the steps after the first log
interval and the final loss (mean of the last 10 % of steps), as the Rust run does.

    python3 benches/peer/moe_train_torch.py --config configs/moe-235m.json --data corpus.txt --steps 200
"""
import argparse, json, math, time

import torch
import torch.nn.functional as F

p = argparse.ArgumentParser()
p.add_argument("--config", required=True)
p.add_argument("--data", required=True)
p.add_argument("--steps", type=int)
p.add_argument("--out")
args = p.parse_args()
cfg = json.load(open(args.config))
m, t = cfg["model"], cfg["train"]
steps = args.steps or t["steps"]
V, H, L, NH, FF, E, K = (m.get("vocab_size", 256), m["hidden_size"], m["num_layers"], m["num_heads"],
                         m["ffn_hidden_size"], m["num_experts"], m["top_k"])
B, S, MB = t["batch_size"], t["seq_len"], t.get("micro_batches", 1)
lr, warmup, min_ratio = t["lr"], t.get("warmup_steps", 30), t.get("min_lr_ratio", 0.1)
aux_coeff, std, log_every = m.get("aux_loss_coeff", 1e-2), m.get("init_std", 0.02), t.get("log_every", 10)
dev, bf = "cuda", torch.bfloat16
torch.manual_seed(t.get("seed", 42))

data = torch.frombuffer(bytearray(open(args.data, "rb").read()), dtype=torch.uint8)
train_data = data[: len(data) * 19 // 20].to(dev)

def param(*shape):
    return torch.nn.Parameter(torch.randn(*shape, device=dev, dtype=bf) * std)

class Layer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.n1, self.n2 = torch.nn.RMSNorm(H, device=dev, dtype=bf), torch.nn.RMSNorm(H, device=dev, dtype=bf)
        self.qkv, self.proj = param(3 * H, H), param(H, H)
        self.router = torch.nn.Parameter(torch.randn(H, E, device=dev) * std)  # f32
        self.w1 = param(E, H, 2 * FF)   # gate and up, [E, in, out] for _grouped_mm
        self.w2 = param(E, FF, H)

    def attention(self, x, cos, sin):
        b, s, _ = x.shape
        q, k, v = (x @ self.qkv.t()).view(b, s, 3, NH, H // NH).permute(2, 0, 3, 1, 4)
        def rope(u):
            u1, u2 = u[..., ::2], u[..., 1::2]
            return torch.stack((u1 * cos - u2 * sin, u1 * sin + u2 * cos), -1).flatten(-2)
        y = F.scaled_dot_product_attention(rope(q), rope(k), v, is_causal=True)
        return y.transpose(1, 2).reshape(b, s, H) @ self.proj.t()

    def moe(self, x):
        x = x.reshape(-1, H)
        T = x.shape[0]
        probs = torch.softmax(x.float() @ self.router, -1)
        w, idx = probs.topk(K, -1)
        counts = torch.bincount(idx.flatten(), minlength=E)
        aux = aux_coeff * E * ((counts.float() / (T * K)) * probs.mean(0)).sum()
        order = idx.flatten().argsort(stable=True)
        xs = x[order // K]
        offs = counts.cumsum(0).to(torch.int32)
        h = torch._grouped_mm(xs, self.w1, offs=offs)
        gate, up = h.chunk(2, -1)
        y = torch._grouped_mm(F.silu(gate) * up, self.w2, offs=offs)
        out = torch.zeros(T * K, H, device=dev, dtype=torch.float32)
        out[order] = y.float()
        out = (out.view(T, K, H) * w.unsqueeze(-1)).sum(1)
        return out.to(bf), aux

    def forward(self, x, cos, sin):
        x = x + self.attention(self.n1(x), cos, sin)
        y, aux = self.moe(self.n2(x))
        return x + y.view_as(x), aux

class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = param(V, H)
        self.layers = torch.nn.ModuleList(Layer() for _ in range(L))
        self.norm, self.head = torch.nn.RMSNorm(H, device=dev, dtype=bf), param(V, H)
        inv = 1.0 / (m.get("rope_theta", 10000.0) ** (torch.arange(0, H // NH, 2, device=dev) / (H // NH)))
        ang = torch.arange(S, device=dev)[:, None] * inv[None]
        self.cos, self.sin = ang.cos().to(bf), ang.sin().to(bf)

    def forward(self, tokens, targets):
        x = self.emb[tokens]
        aux = 0.0
        for layer in self.layers:
            x, a = layer(x, self.cos, self.sin)
            aux = aux + a
        logits = self.norm(x) @ self.head.t()
        loss = F.cross_entropy(logits.float().reshape(-1, V), targets.reshape(-1))
        return loss, aux

model = Model()
print(f"peer: {sum(p.numel() for p in model.parameters())} parameters, {B * S} tokens/step")
opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(t.get("beta1", 0.9), t.get("beta2", 0.95)),
                        weight_decay=t.get("weight_decay", 0.1), fused=True)
def lr_at(step):
    if step < warmup:
        return lr * (step + 1) / warmup
    frac = (step - warmup) / max(1, steps - warmup)
    return lr * (min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * frac)))

gen = torch.Generator(device=dev).manual_seed(t.get("seed", 42))
losses, pending, intervals, start = [], [], [], time.perf_counter()
for step in range(steps):
    for g in opt.param_groups:
        g["lr"] = lr_at(step)
    step_loss = 0.0
    for _ in range(MB):
        starts = torch.randint(0, len(train_data) - S - 1, (B // MB,), device=dev, generator=gen)
        window = train_data[starts[:, None] + torch.arange(S + 1, device=dev)].long()
        loss, aux = model(window[:, :-1], window[:, 1:])
        ((loss + aux) / MB).backward()
        step_loss = step_loss + loss.detach() / MB
    if t.get("grad_clip_norm"):
        for prm in model.parameters():  # per parameter, as Burn's GradientClipping::Norm
            torch.nn.utils.clip_grad_norm_([prm], t["grad_clip_norm"])
    opt.step()
    opt.zero_grad(set_to_none=True)
    pending.append(step_loss)
    if (step + 1) % log_every == 0 or step + 1 == steps:
        vals = torch.stack(pending).tolist()
        now = time.perf_counter()
        intervals.append((len(vals), now - start))
        start = now
        losses += vals
        pending = []
timed = intervals[1:] or intervals
n, sec = sum(a for a, _ in timed), sum(b for _, b in timed)
tail = max(1, len(losses) // 10)
result = {"label": "pytorch-bf16-eager", "steps": steps, "final_loss": sum(losses[-tail:]) / tail,
          "tokens_per_s": n * B * S / sec, "step_ms": 1e3 * sec / n,
          "peak_memory_bytes": torch.cuda.max_memory_reserved(), "losses": losses}
print(json.dumps({k: v for k, v in result.items() if k != "losses"}))
if args.out:
    json.dump(result, open(args.out, "w"))
