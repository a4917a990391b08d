"""PyTorch peer for benches/gemm.rs, timed on the same GPU in the same session, printed as JSON
lines; with --ours FILE (the JSON lines benches/gemm.rs printed) it also prints one `compare` line
per case: our TFLOP/s (or step time) over PyTorch's.

* gemm: Y[M,N] = X[M,K] @ W[N,K]^T with BF16 output: torch.mm (bf16), torch._scaled_mm
  (E4M3 x E4M3 per-tensor scales, use_fast_accum=True as in our fprop) and torch._scaled_mm with
  1x128 x 128x128 block scales (Hopper, cuBLASLt >= 12.9), where this PyTorch build accepts it.
* linear_step: torch.nn.Linear(8192, 8192, bf16) forward + backward on 8192 tokens, and
  Transformer Engine's te.Linear under its recipes when transformer_engine is importable.

    python3 benches/gemm_torch.py [--ours gemm.jsonl]
    python3 benches/gemm_torch.py --turns target/release/deps/gemm-HASH

With --turns it runs benches/gemm.rs and takes turns with it (benches/turns.py says why): before
each timed run of our `gemm` cases on CubeCL's stream and of our Linear steps, PyTorch times one
run of the same case; the ratios are best counted run against best counted run.
"""
import argparse
import json

import torch

from torch_timing import host_time, one_run, timed
from turns import counted, run_in_turns

SHAPES = [(1024, 1024, 1024), (2048, 2048, 2048), (4096, 4096, 4096), (8192, 8192, 8192), (16384, 8192, 8192),
          # the MoE example's projections and expert GEMMs (as benches/gemm.rs)
          (4096, 3072, 1024), (4096, 1024, 1024), (1024, 2048, 1024)]


def iterations_for(m, n, k):
    """Calls per timed run, as benches/gemm.rs."""
    return int(min(400, max(20, 1e14 / (2.0 * m * n * k))))

FP8 = torch.float8_e4m3fn


def gemm_cases(m, n, k):
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
    cases = {"bf16": lambda: torch.mm(x, w.t())}
    xq, wq = x.to(FP8), w.to(FP8)
    one = torch.ones((), device="cuda", dtype=torch.float32)
    cases["fp8_tensor"] = lambda: torch._scaled_mm(
        xq, wq.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16, use_fast_accum=True
    )
    # 1x128 activations: [M, K/128] M-major; 128x128 weights: [roundup(K/128, 4), N/128] K-major.
    kb = k // 128
    scale_x = torch.ones(kb, m, device="cuda").t()
    scale_w = torch.ones(n // 128, (kb + 3) // 4 * 4, device="cuda").t()
    cases["fp8_block"] = lambda: torch._scaled_mm(
        xq, wq.t(), scale_a=scale_x, scale_b=scale_w, out_dtype=torch.bfloat16
    )
    return cases


def linear_cases(tokens, features):
    x = torch.randn(tokens, features, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    cases = {}
    linear = torch.nn.Linear(features, features, device="cuda", dtype=torch.bfloat16)

    def torch_step():
        linear(x).backward(torch.ones(tokens, features, device="cuda", dtype=torch.bfloat16))

    cases["torch_bf16"] = torch_step
    try:
        import transformer_engine.pytorch as te
        from transformer_engine.common import recipe as te_recipe
    except Exception as e:  # noqa: BLE001 - any import failure means "not available"
        print(json.dumps({"bench": "linear_step", "impl": "transformer_engine", "skipped": str(e)[:200]}))
        return cases
    te_linear = te.Linear(features, features, params_dtype=torch.bfloat16, device="cuda")
    recipes = {
        "te_bf16": None,
        "te_current_scaling": te_recipe.Float8CurrentScaling(),
        "te_delayed_scaling": te_recipe.DelayedScaling(),
        "te_block_scaling": te_recipe.Float8BlockScaling(),
    }
    for name, r in recipes.items():
        def step(r=r):
            if r is None:
                y = te_linear(x)
            else:
                with te.fp8_autocast(enabled=True, fp8_recipe=r):
                    y = te_linear(x)
            y.backward(torch.ones_like(y))
        cases[name] = step
    return cases


def turns(binary):
    """Runs benches/gemm.rs (`binary`) and this peer in turns; prints our lines, PyTorch's best
    counted runs and the `compare` lines."""
    state = {"shape": None, "gemms": {}, "linear": None, "runs": {}}

    def time_peer(case, run):
        if case["bench"] == "gemm":
            shape = (case["m"], case["n"], case["k"])
            if state["shape"] != shape:
                state["gemms"] = {}
                torch.cuda.empty_cache()
                state["gemms"] = gemm_cases(*shape)
                state["shape"] = shape
            fn, iterations, key = state["gemms"].get(case["format"]), iterations_for(*shape), ("gemm", case["format"], *shape)
        else:
            if state["linear"] is None:
                state["gemms"], state["shape"] = {}, None
                state["linear"] = linear_cases(8192, 8192)["torch_bf16"]
            fn, iterations, key = state["linear"], 20, ("linear_step", "torch_bf16")
        if fn is None:
            return
        try:
            if run == 0:
                for _ in range(3):  # warm-up: compilation, algorithm choice
                    fn()
            seconds = one_run(fn, iterations)
        except Exception as e:  # noqa: BLE001 - report which variants this build lacks
            print(json.dumps({"bench": key[0], "impl": "torch", "case": case, "error": str(e)[:300]}), flush=True)
            state["gemms"].pop(case.get("format"), None)
            return
        if counted(run):
            state["runs"].setdefault(key, []).append(seconds)

    print(json.dumps({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "mode": "turns"}), flush=True)
    ours = []
    for o in run_in_turns([binary, "--bench"], time_peer):
        print(o if isinstance(o, str) else json.dumps(o), flush=True)
        if isinstance(o, dict):
            ours.append(o)
    theirs = {}
    for key, runs in state["runs"].items():
        if key[0] == "gemm":
            m, n, k = key[2:]
            theirs[key] = 2.0 * m * n * k / min(runs) / 1e12
            print(json.dumps({"bench": "gemm", "impl": "torch", "mode": "turns", "format": key[1], "m": m, "n": n, "k": k,
                              "time_us": round(min(runs) * 1e6, 1), "tflops": round(theirs[key], 1)}))
        else:
            theirs[key] = min(runs)
            print(json.dumps({"bench": "linear_step", "impl": key[1], "mode": "turns", "time_us": round(min(runs) * 1e6, 1),
                              "runs_us": [round(t * 1e6, 1) for t in runs]}))
    # Only the cubecl_stream GEMMs and the Linear steps took turns; the other orderings'
    # ratios would mix the two ways of timing.
    compare([o for o in ours if o.get("bench") != "gemm" or o.get("ordering") == "cubecl_stream"], theirs)
    return 0 if ours else 1


def compare(ours, theirs):
    """One `compare` line per case of ours that PyTorch also timed (`theirs`: TFLOP/s for GEMMs,
    seconds for the Linear steps)."""
    for o in ours:
        if o.get("bench") == "gemm" and o.get("ordering") in ("cubecl_stream", "device_flags"):
            t = theirs.get(("gemm", o["format"], o["m"], o["n"], o["k"]))
            if t:
                print(json.dumps({"compare": "gemm_tflops_ours_over_torch", "ordering": o["ordering"], "format": o["format"],
                                  "m": o["m"], "n": o["n"], "k": o["k"],
                                  "ours": o["tflops"], "torch": round(t, 1), "ratio": round(o["tflops"] / t, 3)}))
        if o.get("bench") == "burn_matmul":
            t = theirs.get(("gemm", "bf16", o["m"], o["n"], o["k"]))
            if t:
                print(json.dumps({"compare": "burn_matmul_tflops_over_torch", "m": o["m"], "n": o["n"], "k": o["k"],
                                  "ours": o["tflops"], "torch": round(t, 1), "ratio": round(o["tflops"] / t, 3)}))
        if o.get("bench") == "linear_step" and "time_us" in o:
            base = theirs.get(("linear_step", "torch_bf16"))
            te = theirs.get(("linear_step", "te_" + o["recipe"]))
            line = {"compare": "linear_step", "recipe": o["recipe"], "ours_us": o["time_us"], "encoder": o.get("encoder", "instruction")}
            if base:
                line["speedup_over_torch_bf16"] = round(base * 1e6 / o["time_us"], 3)
            if te:
                line["te_us"] = round(te * 1e6, 1)
                line["ours_over_te_speed"] = round(te * 1e6 / o["time_us"], 3)
            print(json.dumps(line))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--ours", help="JSON lines from benches/gemm.rs to compare with")
    parser.add_argument("--turns", metavar="BENCH", help="run this benches/gemm.rs binary and the peer in turns")
    args = parser.parse_args()
    if args.turns:
        raise SystemExit(turns(args.turns))
    print(json.dumps({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__}))
    theirs = {}
    for m, n, k in SHAPES:
        flops = 2.0 * m * n * k
        iterations = iterations_for(m, n, k)
        for name, fn in gemm_cases(m, n, k).items():
            try:
                seconds = timed(fn, iterations)
                host = host_time(fn, iterations)
            except Exception as e:  # noqa: BLE001 - report which variants this build lacks
                print(json.dumps({"bench": "gemm", "impl": "torch", "format": name, "m": m, "n": n, "k": k, "error": str(e)[:300]}))
                continue
            theirs[("gemm", name, m, n, k)] = flops / seconds / 1e12
            print(json.dumps({"bench": "gemm", "impl": "torch", "format": name, "m": m, "n": n, "k": k,
                              "time_us": round(seconds * 1e6, 1), "host_us": round(host * 1e6, 1),
                              "tflops": round(flops / seconds / 1e12, 1)}))
    tokens = features = 8192
    for name, fn in linear_cases(tokens, features).items():
        try:
            seconds = timed(fn, 20)
        except Exception as e:  # noqa: BLE001
            print(json.dumps({"bench": "linear_step", "impl": name, "error": str(e)[:300]}))
            continue
        theirs[("linear_step", name)] = seconds
        print(json.dumps({"bench": "linear_step", "impl": name, "tokens": tokens, "in": features, "out": features,
                          "time_us": round(seconds * 1e6, 1)}))
    if not args.ours:
        return
    compare([json.loads(line) for line in open(args.ours) if line.startswith("{")], theirs)


if __name__ == "__main__":
    main()
