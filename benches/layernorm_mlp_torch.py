"""PyTorch peer for benches/layernorm_mlp.rs, timed on the same GPU in the same session, printed as
JSON lines; with --ours FILE (the JSON lines benches/layernorm_mlp.rs printed) it also prints one
`compare` line per (activation, recipe): our step time against PyTorch BF16 eager and
torch.compile, and against our own bf16 recipe.

* mlp_step: LayerNorm(4096) -> Linear(4096, F') -> activation -> Linear(16384, 4096), bias, BF16
  parameters and activations, 8192 tokens, forward + backward (input and every parameter), gelu
  (tanh approximation, TE's) and swiglu (F' = 2 * 16384), eager and torch.compile.

    python3 benches/layernorm_mlp_torch.py [--ours layernorm_mlp.jsonl]
    python3 benches/layernorm_mlp_torch.py --turns target/release/deps/layernorm_mlp-HASH

With --turns the steps only, ours and PyTorch's in turns (benches/turns.py says why).
"""
import argparse
import json

import torch
import torch.nn.functional as F

from torch_timing import one_run, timed
from turns import counted, run_in_turns


class Mlp(torch.nn.Module):
    def __init__(self, hidden, ffn, activation):
        super().__init__()
        self.activation = activation
        width = 2 * ffn if activation == "swiglu" else ffn
        self.norm = torch.nn.LayerNorm(hidden, eps=1e-5)
        self.fc1 = torch.nn.Linear(hidden, width)
        self.fc2 = torch.nn.Linear(ffn, hidden)

    def forward(self, x):
        h = self.fc1(self.norm(x))
        if self.activation == "swiglu":
            a, b = h.chunk(2, dim=-1)
            h = F.silu(a) * b
        else:
            h = F.gelu(h, approximate="tanh")
        return self.fc2(h)


def step_of(model, x):
    tokens, hidden = x.shape

    def step():
        # The output gradient made in the step, as Burn's `backward()` makes ours (a fill of ones).
        model(x).backward(torch.ones(tokens, hidden, device="cuda", dtype=torch.bfloat16))

    return step


def turns(binary):
    """Runs benches/layernorm_mlp.rs (`binary`) and this peer in turns (`benches/turns.py`): before
    each round of our recipes PyTorch's eager and compiled steps time one run each. Prints our
    lines, then one `compare` line per (activation, recipe): best counted runs."""
    tokens, hidden, ffn = 8192, 4096, 16384
    x = torch.randn(tokens, hidden, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    state = {"activation": None, "steps": {}, "runs": {}}

    def time_peer(case, run):
        act = case["activation"]
        if state["activation"] != act:
            state["steps"] = {}
            torch.cuda.empty_cache()
            model = Mlp(hidden, ffn, act).cuda().to(torch.bfloat16)
            state["steps"] = {"torch_bf16": step_of(model, x),
                              "torch_compile_bf16": step_of(torch.compile(model), x)}
            for step in state["steps"].values():  # warm-up, compilation
                for _ in range(3):
                    step()
            torch.cuda.synchronize()
            state["activation"] = act
        for impl, step in state["steps"].items():
            seconds = one_run(step, 10)
            if counted(run):
                state["runs"].setdefault((act, impl), []).append(seconds)

    print(json.dumps({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "mode": "turns"}), flush=True)
    ours = []
    for o in run_in_turns([binary, "--bench"], time_peer, {"LOWP_BENCH_FILTER": "mlp_step"}):
        print(o if isinstance(o, str) else json.dumps(o), flush=True)
        if isinstance(o, dict) and o.get("bench") == "mlp_step" and "time_us" in o:
            ours.append(o)
    for (act, impl), runs in state["runs"].items():
        width = 2 * ffn if act == "swiglu" else ffn
        flops = 3 * 2 * tokens * hidden * (width + ffn)
        print(json.dumps({"bench": "mlp_step", "impl": impl, "activation": act, "mode": "turns",
                          "time_us": round(min(runs) * 1e6, 1), "runs_us": [round(t * 1e6, 1) for t in runs],
                          "tflops": round(flops / min(runs) / 1e12, 1)}))
    compare(ours, {key: min(runs) for key, runs in state["runs"].items()})
    return 0 if ours else 1


def compare(ours, theirs):
    """One `compare` line per (activation, recipe) of ours: speed-ups over PyTorch's steps
    (`theirs`: (activation, impl) -> seconds) and over our own bf16 recipe."""
    our_bf16 = {o["activation"]: o["time_us"] for o in ours if o.get("bench") == "mlp_step" and o.get("recipe") == "bf16" and "time_us" in o}
    for o in ours:
        if o.get("bench") != "mlp_step" or "time_us" not in o:
            continue
        act = o["activation"]
        line = {"compare": "mlp_step", "activation": act, "recipe": o["recipe"], "ours_us": o["time_us"], "encoder": o.get("encoder", "instruction")}
        for impl in ["torch_bf16", "torch_compile_bf16"]:
            t = theirs.get((act, impl))
            if t:
                line["speedup_over_" + impl] = round(t * 1e6 / o["time_us"], 3)
        if act in our_bf16:
            line["speedup_over_our_bf16"] = round(our_bf16[act] / o["time_us"], 3)
        print(json.dumps(line))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--ours", help="JSON lines from benches/layernorm_mlp.rs to compare with")
    parser.add_argument("--turns", metavar="BENCH",
                        help="run this benches/layernorm_mlp.rs binary and the peer in turns")
    args = parser.parse_args()
    if args.turns:
        raise SystemExit(turns(args.turns))
    print(json.dumps({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__}))
    tokens, hidden, ffn = 8192, 4096, 16384
    theirs = {}
    x = torch.randn(tokens, hidden, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    for activation in ["gelu", "swiglu"]:
        model = Mlp(hidden, ffn, activation).cuda().to(torch.bfloat16)
        compiled = torch.compile(model)
        for impl, m in [("torch_bf16", model), ("torch_compile_bf16", compiled)]:
            def step(m=m):
                m(x).backward(torch.ones(tokens, hidden, device="cuda", dtype=torch.bfloat16))
            try:
                seconds = timed(step, 10)
            except Exception as e:  # noqa: BLE001 - report, keep going
                print(json.dumps({"bench": "mlp_step", "impl": impl, "activation": activation, "error": str(e)[:300]}))
                continue
            theirs[(activation, impl)] = seconds
            width = 2 * ffn if activation == "swiglu" else ffn
            flops = 3 * 2 * tokens * hidden * (width + ffn)
            print(json.dumps({"bench": "mlp_step", "impl": impl, "activation": activation, "time_us": round(seconds * 1e6, 1),
                              "tflops": round(flops / seconds / 1e12, 1)}))
        del model, compiled
        torch.cuda.empty_cache()
    if not args.ours:
        return
    ours = [json.loads(line) for line in open(args.ours) if line.startswith("{")]
    compare(ours, theirs)

if __name__ == "__main__":
    main()
