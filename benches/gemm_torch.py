"""PyTorch peer for benches/gemm.rs, timed on the same GPU in the same session, printed as JSON
lines; with --ours FILE (the JSON lines benches/gemm.rs printed) it also prints one `compare` line
per case: our TFLOP/s (or step time) over PyTorch's.

* gemm: Y[M,N] = X[M,K] @ W[N,K]^T with BF16 output: torch.mm (bf16), torch._scaled_mm
  (E4M3 x E4M3 per-tensor scales, use_fast_accum=True as in our fprop) and torch._scaled_mm with
  1x128 x 128x128 block scales (Hopper, cuBLASLt >= 12.9), where this PyTorch build accepts it.
* linear_step: torch.nn.Linear(8192, 8192, bf16) forward + backward on 8192 tokens, and
  Transformer Engine's te.Linear under its recipes when transformer_engine is importable.

    python3 benches/gemm_torch.py [--ours gemm.jsonl]
"""
import argparse
import json

import torch

from torch_timing import host_time, timed

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


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--ours", help="JSON lines from benches/gemm.rs to compare with")
    args = parser.parse_args()
    print(json.dumps({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__}))
    theirs = {}
    shapes = [(1024, 1024, 1024), (2048, 2048, 2048), (4096, 4096, 4096), (8192, 8192, 8192), (16384, 8192, 8192),
              # the MoE example's projections and expert GEMMs (as benches/gemm.rs)
              (4096, 3072, 1024), (4096, 1024, 1024), (1024, 2048, 1024)]
    for m, n, k in shapes:
        flops = 2.0 * m * n * k
        iterations = int(min(400, max(20, 1e14 / flops)))
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
    ours = [json.loads(line) for line in open(args.ours) if line.startswith("{")]
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


if __name__ == "__main__":
    main()
