"""PyTorch peer for benches/grouped.rs, timed on the same GPU in the same session, printed as JSON
lines; with --ours FILE (the JSON lines benches/grouped.rs printed) it uses the same splits and
prints one `compare` line per case: our TFLOP/s (or step time) over PyTorch's.

* grouped_gemm: fprop Y[T,N] = X[T,K] . W[E,N,K]^T, dgrad dX[T,K] = dY[T,N] . W[E,N,K], wgrad
  dW[E,N,K] = dY^T . X per expert, BF16 output, device offsets (no host read):
  bf16 -> torch._grouped_mm (CUTLASS SM90); fp8_tensor -> torch._scaled_grouped_mm (E4M3 x E4M3,
  rowwise scales, fast accumulation: PyTorch has no per-tensor grouped FP8 GEMM on Hopper; rowwise
  is the closest and at least as capable). FP8 block (1x128 x 128x128) has no grouped PyTorch
  GEMM on Hopper: its ratio is taken against torch's BF16 _grouped_mm.
* grouped_linear_step: the BF16 grouped linear forward + backward in PyTorch: fprop, dgrad and
  wgrad with torch._grouped_mm, plus the bias add and its gradient, on the same splits.

    python3 benches/grouped_torch.py [--ours grouped.jsonl]
"""
import argparse
import json
import math

import torch

from torch_timing import timed

FP8 = torch.float8_e4m3fn


class Rng:
    """splitmix64, as benches/grouped.rs."""

    def __init__(self, seed):
        self.s = seed & (2**64 - 1)

    def next(self):
        m = 2**64 - 1
        self.s = (self.s + 0x9E3779B97F4A7C15) & m
        z = self.s
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & m
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & m
        return z ^ (z >> 31)

    def uniform(self):
        return ((self.next() >> 11) + 0.5) / 2**53

    def normal(self):
        return math.sqrt(-2.0 * math.log(self.uniform())) * math.cos(2.0 * math.pi * self.uniform())


def make_splits(experts, tokens, skewed):
    if not skewed:
        s = [tokens // experts] * experts
        s[-1] += tokens - sum(s)
        return s
    rng = Rng(experts * 1_000_003 + tokens)
    w = [math.exp(rng.normal()) for _ in range(experts)]
    for _ in range(max(1, experts // 16)):
        w[rng.next() % experts] = 0.0
    total = sum(w)
    s = [math.floor(v / total * tokens) for v in w]
    largest = max(range(experts), key=lambda e: (s[e], e))  # the last largest, as Rust max_by_key
    s[largest] += tokens - sum(s)
    return s


def offsets(splits):
    return torch.tensor(splits, device="cuda", dtype=torch.int32).cumsum(0, dtype=torch.int32)


def gemm_cases(experts, tokens, k, n, splits):
    offs = offsets(splits)
    x = torch.randn(tokens, k, device="cuda", dtype=torch.bfloat16)
    dy = torch.randn(tokens, n, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(experts, n, k, device="cuda", dtype=torch.bfloat16)
    cases = {
        ("bf16", "fprop"): lambda: torch._grouped_mm(x, w.transpose(-2, -1), offs=offs, out_dtype=torch.bfloat16),
        ("bf16", "dgrad"): lambda: torch._grouped_mm(dy, w, offs=offs, out_dtype=torch.bfloat16),
        ("bf16", "wgrad"): lambda: torch._grouped_mm(dy.t(), x, offs=offs, out_dtype=torch.bfloat16),
    }
    # FP8: A row-major, B column-major (TN) only; rowwise f32 scales.
    xq, dyq = x.to(FP8), dy.to(FP8)
    wq = w.to(FP8)  # [E, N, K]: as B^T of fprop, column-major view via transpose
    wtq = w.transpose(1, 2).contiguous().to(FP8)  # [E, K, N]: dgrad's B^T
    dytq = dy.t().contiguous().to(FP8)  # [N, T]
    xtq = x.t().contiguous().to(FP8)  # [K, T]
    ones = lambda *s: torch.ones(*s, device="cuda", dtype=torch.float32)
    cases[("fp8_tensor", "fprop")] = lambda: torch._scaled_grouped_mm(
        xq, wq.transpose(-2, -1), ones(tokens), ones(experts, n), offs=offs,
        out_dtype=torch.bfloat16, use_fast_accum=True)
    cases[("fp8_tensor", "dgrad")] = lambda: torch._scaled_grouped_mm(
        dyq, wtq.transpose(-2, -1), ones(tokens), ones(experts, k), offs=offs,
        out_dtype=torch.bfloat16, use_fast_accum=True)
    cases[("fp8_tensor", "wgrad")] = lambda: torch._scaled_grouped_mm(
        dytq, xtq.t(), ones(experts * n), ones(experts * k), offs=offs,
        out_dtype=torch.bfloat16, use_fast_accum=True)
    return cases


def step_case(experts, tokens, features, splits):
    offs = offsets(splits)
    x = torch.randn(tokens, features, device="cuda", dtype=torch.bfloat16)
    dy = torch.randn(tokens, features, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(experts, features, features, device="cuda", dtype=torch.bfloat16) * 0.023
    bias = torch.zeros(experts, features, device="cuda", dtype=torch.bfloat16)
    expert_of_row = torch.repeat_interleave(
        torch.arange(experts, device="cuda"), torch.tensor(splits, device="cuda"), output_size=tokens)

    def step():
        y = torch._grouped_mm(x, w.transpose(-2, -1), offs=offs, out_dtype=torch.bfloat16)
        y = y + bias[expert_of_row]
        dx = torch._grouped_mm(dy, w, offs=offs, out_dtype=torch.bfloat16)
        dw = torch._grouped_mm(dy.t(), x, offs=offs, out_dtype=torch.bfloat16)
        db = torch.zeros(experts, features, device="cuda", dtype=torch.float32).index_add_(
            0, expert_of_row, dy.float())
        return y, dx, dw, db

    return step


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--ours", help="JSON lines from benches/grouped.rs")
    parser.add_argument("--steps-only", action="store_true",
                        help="only the GroupedLinear step (no grouped GEMM cases)")
    args = parser.parse_args()
    ours = []
    if args.ours:
        with open(args.ours) as f:
            for line in f:
                line = line.strip()
                if line.startswith("{"):
                    ours.append(json.loads(line))
    print(json.dumps({"bench": "torch_env", "torch": torch.__version__,
                      "gpu": torch.cuda.get_device_name()}))

    torch_results = {}
    shapes = [(8, 32768, 7168, 2048), (16, 32768, 2048, 768), (128, 65536, 2048, 1536)]
    if args.steps_only:
        shapes = []
    for experts, tokens, k, n in shapes:
        for dist in ["balanced", "skewed"]:
            splits = next((o["splits"] for o in ours if o.get("bench") == "grouped_gemm"
                           and (o["experts"], o["tokens"], o["k"], o["n"], o["dist"]) == (experts, tokens, k, n, dist)),
                          make_splits(experts, tokens, dist == "skewed"))
            flops = 2.0 * tokens * n * k
            iterations = int(min(max(2e14 / flops, 5), 100))
            for (fmt, gemm), fn in gemm_cases(experts, tokens, k, n, splits).items():
                line = {"bench": "torch_grouped_gemm", "format": fmt, "gemm": gemm, "experts": experts,
                        "tokens": tokens, "k": k, "n": n, "dist": dist}
                if fmt == "fp8_tensor" and gemm == "wgrad" and any(s % 16 for s in splits):
                    # The ragged reduction dim of the FP8 2D x 2D mode must be 16-aligned per group:
                    # other splits trip a device-side assert that poisons the CUDA context.
                    line["error"] = "unsupported: FP8 ragged-K needs every split % 16 == 0"
                    print(json.dumps(line), flush=True)
                    continue
                try:
                    seconds = timed(fn, iterations)
                    line["time_us"] = round(seconds * 1e6, 1)
                    line["tflops"] = round(flops / seconds / 1e12, 1)
                    torch_results[(fmt, gemm, experts, tokens, k, n, dist)] = line["tflops"]
                except Exception as e:  # an unsupported mode reports itself
                    line["error"] = repr(e)[:300]
                print(json.dumps(line), flush=True)
            torch.cuda.empty_cache()

    step_results = {}
    for dist in ["balanced", "skewed"]:
        experts, tokens, features = 8, 32768, 2048
        splits = next((o["splits"] for o in ours if o.get("bench") == "grouped_linear_step"
                       and o["dist"] == dist), make_splits(experts, tokens, dist == "skewed"))
        seconds = timed(step_case(experts, tokens, features, splits), 10)
        step_results[dist] = seconds
        print(json.dumps({"bench": "torch_grouped_linear_step", "dist": dist, "experts": experts,
                          "tokens": tokens, "in": features, "out": features,
                          "time_us": round(seconds * 1e6, 1),
                          "tflops": round(6.0 * tokens * features * features / seconds / 1e12, 1)}), flush=True)

    for o in ours:
        if "tflops" not in o:
            continue
        if o["bench"] == "grouped_gemm":
            peer_format = {"fp8_block": "bf16", "fp8_tensor_shared": "fp8_tensor"}.get(o["format"], o["format"])
            key = (peer_format, o["gemm"], o["experts"], o["tokens"], o["k"], o["n"], o["dist"])
            if key in torch_results:
                print(json.dumps({"bench": "compare", "case": "grouped_gemm", "format": o["format"],
                                  "peer": f"torch {peer_format}", "gemm": o["gemm"],
                                  "shape": [o["experts"], o["tokens"], o["k"], o["n"]], "dist": o["dist"],
                                  "path": o["path"], "batch": o.get("batch"), "accumulation": o.get("accumulation"),
                                  "ours_tflops": o["tflops"], "torch_tflops": torch_results[key],
                                  "ratio": round(o["tflops"] / torch_results[key], 3)}))
        elif o["bench"] == "grouped_linear_step" and o["dist"] in step_results:
            print(json.dumps({"bench": "compare", "case": "grouped_linear_step", "recipe": o["recipe"],
                              "dist": o["dist"], "ours_us": o["time_us"],
                              "torch_bf16_us": round(step_results[o["dist"]] * 1e6, 1),
                              "speedup_over_torch_bf16": round(step_results[o["dist"]] * 1e6 / o["time_us"], 3),
                              "blocking_syncs_per_step": o.get("blocking_syncs_per_step"),
                              "split_reads_per_step": o.get("split_reads_per_step")}))


if __name__ == "__main__":
    main()
