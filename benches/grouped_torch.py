"""PyTorch peer for benches/grouped.rs, timed on the same GPU in the same session, printed as JSON
lines; with --ours FILE (the JSON lines benches/grouped.rs printed) it uses the same splits and
prints one `compare` line per case: our TFLOP/s (or step time) over PyTorch's.

* grouped_gemm: fprop Y[T,N] = X[T,K] . W[E,N,K]^T, dgrad dX[T,K] = dY[T,N] . W[E,N,K], wgrad
  dW[E,N,K] = dY^T . X per expert, BF16 output, device offsets (no host read):
  bf16 -> torch._grouped_mm (CUTLASS SM90); fp8_tensor -> torch._scaled_grouped_mm (E4M3 x E4M3,
  rowwise scales, fast accumulation: PyTorch has no per-tensor grouped FP8 GEMM on Hopper; rowwise
  is the closest and at least as capable); fp8_tensor_split_acc -> the same without fast
  accumulation (our split accumulator's numerics). FP8 block (1x128 x 128x128) has no grouped PyTorch
  GEMM on Hopper: its ratio is taken against torch's BF16 _grouped_mm.
* grouped_linear_step: the BF16 grouped linear forward + backward in PyTorch: fprop, dgrad and
  wgrad with torch._grouped_mm, plus the bias add and its gradient, on the same splits.

    python3 benches/grouped_torch.py [--ours grouped.jsonl]
    python3 benches/grouped_torch.py --turns target/release/deps/grouped-HASH   # both, in turns

With --turns the bench and the peer alternate run by run on each case (benches/turns.py says why).
"""
import argparse
import json
import math

import torch

from torch_timing import one_run, timed
from turns import counted, run_in_turns

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
    # fp8_tensor: fast accumulation; fp8_tensor_split_acc: FP32 promotion of the partial sums
    # (`use_fast_accum=False`), the numerics of our split accumulator (TE's default for dgrad and
    # wgrad).
    for fmt, fast in (("fp8_tensor", True), ("fp8_tensor_split_acc", False)):
        cases[(fmt, "fprop")] = lambda fast=fast: torch._scaled_grouped_mm(
            xq, wq.transpose(-2, -1), ones(tokens), ones(experts, n), offs=offs,
            out_dtype=torch.bfloat16, use_fast_accum=fast)
        cases[(fmt, "dgrad")] = lambda fast=fast: torch._scaled_grouped_mm(
            dyq, wtq.transpose(-2, -1), ones(tokens), ones(experts, k), offs=offs,
            out_dtype=torch.bfloat16, use_fast_accum=fast)
        cases[(fmt, "wgrad")] = lambda fast=fast: torch._scaled_grouped_mm(
            dytq, xtq.t(), ones(experts * n), ones(experts * k), offs=offs,
            out_dtype=torch.bfloat16, use_fast_accum=fast)
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


def gemm_iterations(flops):
    return int(min(max(2e14 / flops, 5), 100))


class Peers:
    """The PyTorch side of each case of benches/grouped.rs, built on first use and kept while
    the cases of one shape and split run (one shape's operands at a time)."""

    def __init__(self):
        self.shape = None
        self.cases = {}
        self.warm = set()

    def peer(self, case):
        """(callable, iterations, format name) for one of our cases, or None where PyTorch has
        no peer. FP8 per-tensor cases get the peer with their accumulation (fast or FP32
        promotion); FP8 block ones get BF16 (no grouped block-scaled GEMM on Hopper)."""
        if case["bench"] == "grouped_linear_step":
            key = ("step", case["dist"])
            if self.shape != "step":
                self.cases, self.warm, self.shape = {}, set(), "step"
                torch.cuda.empty_cache()
            if key not in self.cases:
                self.cases[key] = step_case(case["experts"], case["tokens"], case["in"], case["splits"])
            return self.cases[key], 10, "bf16 step"
        shape = (case["experts"], case["tokens"], case["k"], case["n"], case["dist"])
        if shape != self.shape:
            self.cases, self.warm, self.shape = {}, set(), shape
            torch.cuda.empty_cache()
            self.cases = gemm_cases(*shape[:4], case["splits"])
        fmt = {"fp8_block": "bf16", "fp8_tensor_shared": "fp8_tensor"}.get(case["format"], case["format"])
        if fmt == "fp8_tensor" and case.get("accumulation") == "split":
            fmt = "fp8_tensor_split_acc"
        if fmt.startswith("fp8") and case["gemm"] == "wgrad" and any(s % 16 for s in case["splits"]):
            return None  # the FP8 ragged-K mode's device assert (see below)
        fn = self.cases.get((fmt, case["gemm"]))
        flops = 2.0 * case["tokens"] * case["k"] * case["n"]
        return (fn, gemm_iterations(flops), fmt) if fn else None

    def run(self, case):
        """Seconds per call of one timed run of the case's peer (after a warm-up on first use)."""
        found = self.peer(case)
        if found is None:
            return None, None
        fn, iterations, fmt = found
        if id(fn) not in self.warm:
            for _ in range(3):
                fn()
            torch.cuda.synchronize()
            self.warm.add(id(fn))
        return one_run(fn, iterations), fmt


def turns(binary):
    """Runs benches/grouped.rs (`binary`) and its PyTorch peer in turns (`benches/turns.py`): before
    each of our timed runs the peer times one run of the same case. Prints our lines, then one
    `compare` line per case: our best counted run against the peer's."""
    peers = Peers()
    peer = {"runs": [], "format": None}

    def time_peer(case, run):
        try:
            seconds, peer["format"] = peers.run(case)
        except Exception as e:  # an unsupported mode reports itself and the case goes on
            seconds, peer["format"] = None, repr(e)[:200]
        if seconds is not None and counted(run):
            peer["runs"].append(seconds)

    print(json.dumps({"bench": "torch_env", "torch": torch.__version__,
                      "gpu": torch.cuda.get_device_name(), "mode": "turns"}), flush=True)
    failed = False
    for o in run_in_turns([binary, "--bench"], time_peer):
        print(o if isinstance(o, str) else json.dumps(o), flush=True)
        if isinstance(o, str):
            continue
        failed |= "error" in o and o.get("bench") == "turns"
        if "time_us" in o and peer["runs"]:
            best = min(peer["runs"])
            print(json.dumps({
                "bench": "compare", "mode": "turns", "case": o["bench"], "format": o.get("format"),
                "recipe": o.get("recipe"), "gemm": o.get("gemm"), "peer": f"torch {peer['format']}",
                "shape": [o["experts"], o["tokens"], o.get("k", o.get("in")), o.get("n", o.get("out"))],
                "dist": o["dist"], "path": o.get("path"), "batch": o.get("batch"),
                "accumulation": o.get("accumulation"), "ours_us": o["time_us"],
                "torch_us": round(best * 1e6, 1), "torch_runs_us": [round(t * 1e6, 1) for t in peer["runs"]],
                "ratio": round(best / (o["time_us"] * 1e-6), 3)}), flush=True)
        peer["runs"] = []
    return 1 if failed else 0


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--ours", help="JSON lines from benches/grouped.rs")
    parser.add_argument("--turns", metavar="BENCH",
                        help="run this benches/grouped.rs binary and the peer in turns (see `turns`)")
    parser.add_argument("--steps-only", action="store_true",
                        help="only the GroupedLinear step (no grouped GEMM cases)")
    args = parser.parse_args()
    if args.turns:
        raise SystemExit(turns(args.turns))
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
                if fmt.startswith("fp8") and gemm == "wgrad" and any(s % 16 for s in splits):
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
                line = {"bench": "compare", "case": "grouped_gemm", "format": o["format"],
                        "peer": f"torch {peer_format}", "gemm": o["gemm"],
                        "shape": [o["experts"], o["tokens"], o["k"], o["n"]], "dist": o["dist"],
                        "path": o["path"], "batch": o.get("batch"), "accumulation": o.get("accumulation"),
                        "ours_tflops": o["tflops"], "torch_tflops": torch_results[key],
                        "ratio": round(o["tflops"] / torch_results[key], 3)}
                # Our split accumulator against PyTorch's (the same numerics), where it has one.
                same = ("fp8_tensor_split_acc",) + key[1:]
                if o.get("accumulation") == "split" and same in torch_results:
                    line["torch_split_acc_tflops"] = torch_results[same]
                    line["ratio_split_acc"] = round(o["tflops"] / torch_results[same], 3)
                print(json.dumps(line))
        elif o["bench"] == "grouped_linear_step" and o["dist"] in step_results:
            print(json.dumps({"bench": "compare", "case": "grouped_linear_step", "recipe": o["recipe"],
                              "dist": o["dist"], "ours_us": o["time_us"],
                              "torch_bf16_us": round(step_results[o["dist"]] * 1e6, 1),
                              "speedup_over_torch_bf16": round(step_results[o["dist"]] * 1e6 / o["time_us"], 3),
                              "blocking_syncs_per_step": o.get("blocking_syncs_per_step"),
                              "split_reads_per_step": o.get("split_reads_per_step")}))


if __name__ == "__main__":
    main()
