"""Probe of the sm90 grouped GEMM kernels (src/backend/sm90/grouped_gemm.cu) on the GPU machine,
through `harness.cu` (ctypes) and PyTorch: correctness against an FP32 reference per expert, then
TFLOP/s in turns with torch._grouped_mm / torch._scaled_grouped_mm on benches/grouped.rs's MoE shapes.

  python3 probe.py [LIB | --build] [--check] [--time] [--selected [--x2]] [--only KERNEL ...]
                   [--bands 1,16] [--shapes E,T,K,N ...]
                   [--wgrad [--wgrad-no-time] [--wgrad-shapes E,T,M,N ...]]

--build: compile harness.cu with nvcc (CUDA_HOME/bin, PATH, or the pip package nvidia-cuda-nvcc)
into a temporary directory instead of taking a built LIB.
--wgrad: the K-grouped weight gradient (`lowp_grouped_wgrad_*`, dW_e = dY_eᵀ · X_e over each
expert's device-side rows): every variant against an FP32 reference per expert on uneven splits
with an empty expert and row and column tails, BF16 and FP8 (E4M3, E5M2 dY x E4M3 X) with
per-expert scales, f32 and bf16 output, f32 accumulation (an empty expert's block must stay as it
was, or be zeros without accumulation); relative error bounds that fail the run. Then (unless
--wgrad-no-time) times the fine-grained MoE's wgrad shapes (--wgrad-shapes: E experts, T
assignment rows of a micro-batch split unevenly, dW_e [M, N]) in turns with a per-expert PyTorch
loop (one cuBLAS GEMM an expert, replayed from a CUDA graph, as the crate's per-expert wgrad) and
torch._grouped_mm / torch._scaled_grouped_mm's K-grouped (2d x 2d) form where this PyTorch has it.

--check: every kernel on skewed splits with empty experts and column and K tails, with and without
per-expert scales and bias (the e5m2_* kernels with E5M2 rows, E4M3 weights); the grouped
matrix's tail rows must be zero. --time: TFLOP/s of fprop/dgrad per kernel in turns with PyTorch
(`in_turns`: LOWP_ROUNDS rounds, default 5, after a heating run; the ratio of the best times and
the median of the rounds' ratios); --selected keeps the kernel and tile order
`backend::sm90_grouped` picks, and --x2 its twin in clusters of two CTAs (B multicast).
LOWP_BAND sets the tile order's band for --check (harness.cu reads it per launch).
"""
import argparse
import ctypes
import math
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from grouped_torch import make_splits  # noqa: E402

FP8 = torch.float8_e4m3fn
E5M2 = torch.float8_e5m2  # the rows (A) of the e5m2_* kernels: the hybrid recipes' gradient


class Kernels:
    def __init__(self, path):
        self.lib = ctypes.CDLL(path)
        self.lib.lowp_probe_name.restype = ctypes.c_char_p
        c = ctypes
        self.lib.lowp_probe_launch.argtypes = [
            c.c_int, c.c_void_p, c.c_void_p, c.c_void_p, c.c_int, c.c_void_p, c.c_void_p, c.c_int,
            c.c_int, c.c_int, c.c_int, c.c_void_p, c.c_int, c.c_void_p, c.c_int, c.c_void_p,
            c.c_int, c.c_void_p]
        self.ids = {self.lib.lowp_probe_name(i).decode(): i for i in range(self.lib.lowp_probe_count())}
        self.sms = torch.cuda.get_device_properties(0).multi_processor_count
        self.wgrad_ids = {}
        if hasattr(self.lib, "lowp_probe_wgrad_launch"):
            self.lib.lowp_probe_wgrad_name.restype = ctypes.c_char_p
            self.lib.lowp_probe_wgrad_launch.argtypes = [
                c.c_int, c.c_void_p, c.c_void_p, c.c_void_p, c.c_void_p, c.c_void_p, c.c_int,
                c.c_int, c.c_int, c.c_int, c.c_void_p, c.c_int, c.c_void_p, c.c_int, c.c_int,
                c.c_int, c.c_void_p]
            self.wgrad_ids = {self.lib.lowp_probe_wgrad_name(i).decode(): i
                              for i in range(self.lib.lowp_probe_wgrad_count())}

    def wgrad(self, name, a, b, d, lay, m, n, scale_a=None, scale_b=None, f32=True, accumulate=False,
              grid=None):
        """dW [E, m, n] (d: f32 or bf16) from BF16 a = dY [P, m], b = X [P, n], or FP8 a = dYᵀ
        [m, P], b = Xᵀ [n, P]; scale_a, scale_b: per expert [E] (step 1)."""
        p = a.shape[0] if name.startswith("wgrad_bf16") else a.shape[1]
        units = lay.groups * -(-m // 128) * -(-n // (128 if "_128" in name else 256))
        grid = grid or min(self.sms, max(units, 1))
        ptr = lambda t: t.data_ptr() if t is not None else None
        flags = (1 if f32 else 0) | (2 if accumulate else 0)
        rc = self.lib.lowp_probe_wgrad_launch(
            self.wgrad_ids[name], a.data_ptr(), b.data_ptr(), d.data_ptr(),
            lay.start_dev.data_ptr(), lay.rows_dev.data_ptr(), lay.groups, p, m, n,
            ptr(scale_a), 1, ptr(scale_b), 1, flags, grid, torch.cuda.current_stream().cuda_stream)
        if rc != 0:
            raise RuntimeError(f"{name}: launch returned {rc}")

    def launch(self, name, a, b, d, lay, n, k, scale_a=None, scale_b=None, bias=None, grid=None):
        """scale_a: per expert [E]; scale_b: one value shared by the experts (step 0)."""
        p = a.shape[0]
        grid = grid or self.sms
        ptr = lambda t: t.data_ptr() if t is not None else None
        rc = self.lib.lowp_probe_launch(
            self.ids[name], a.data_ptr(), b.data_ptr(), d.data_ptr(), d.shape[1],
            lay.start_dev.data_ptr(), lay.rows_dev.data_ptr(), lay.groups, p, n, k,
            ptr(scale_a), 1, ptr(scale_b), 0, ptr(bias), grid,
            torch.cuda.current_stream().cuda_stream)
        if rc != 0:
            raise RuntimeError(f"{name}: launch returned {rc}")


class Layout:
    """Packed rows as the crate's GroupLayout: expert e's rows start at the aligned row
    start[e] (a multiple of 128) and take its aligned length; the buffers hold the host-known
    bound of chunks, (T + 127 E) / 128."""

    def __init__(self, splits):
        self.groups = len(splits)
        aligned = [128 * math.ceil(m / 128) for m in splits]
        self.start = [sum(aligned[:e]) for e in range(len(splits))]
        self.filled_rows = sum(aligned)
        self.aligned = aligned
        self.start_dev = torch.tensor(self.start, device="cuda", dtype=torch.int32)
        self.rows_dev = torch.tensor(aligned, device="cuda", dtype=torch.int32)
        rows = []
        for e, m in enumerate(splits):
            rows.extend(range(self.start[e], self.start[e] + m))
        self.token_rows = torch.tensor(rows, device="cuda", dtype=torch.long)
        self.p = 128 * math.ceil((sum(splits) + 127 * len(splits)) / 128)


def pack(x, rows, p):
    out = torch.randn(p, x.shape[1], device="cuda").to(x.dtype)  # padding rows hold garbage
    out[rows] = x
    return out


def rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30)).item()


def check(kern):
    torch.manual_seed(0)
    cases = [([300, 0, 1, 517, 128], 208, 384), ([0, 129, 2000], 1024, 512), ([64] * 3, 64, 256),
             ([0, 0, 700, 0], 256, 640)]
    failures = 0
    for splits, k, n in cases:
        e = len(splits)
        lay = Layout(splits)
        t = sum(splits)
        x = torch.randn(t, k, device="cuda")
        dy = torch.randn(t, n, device="cuda")
        w = torch.randn(e, n, k, device="cuda")
        scale_a = torch.rand(e, device="cuda") + 0.5
        scale_b = torch.rand(1, device="cuda") + 0.5
        offs = [0]
        for m in splits:
            offs.append(offs[-1] + m)
        for name in kern.ids:
            fp8 = name.startswith(("e4m3", "e5m2"))
            nn = "_nn_" in name
            dt = FP8 if fp8 else torch.bfloat16
            a_dt = E5M2 if name.startswith("e5m2") else dt
            if nn:  # dgrad: dX = dY · W_e, output width k, reduction n
                a_rows, b_op, out_n, red = dy, w, k, n
            else:  # fprop: Y = X · W_eᵀ
                a_rows, b_op, out_n, red = x, w, n, k
            a_q = a_rows.to(a_dt)
            b_q = b_op.to(dt).contiguous()
            a_p = pack(a_q.float(), lay.token_rows, lay.p).to(a_dt)
            for epilogue in (False, True):
                d = torch.full((lay.p, out_n), float("nan"), device="cuda").bfloat16()
                bias = torch.randn(e, out_n, device="cuda").bfloat16() if epilogue else None
                kern.launch(name, a_p, b_q, d, lay, out_n, red,
                            scale_a if epilogue else None, scale_b if epilogue else None, bias)
                torch.cuda.synchronize()
                worst = 0.0
                for g in range(e):
                    m = splits[g]
                    if m == 0:
                        continue
                    ref = a_q[offs[g]:offs[g + 1]].float() @ (b_q[g].float() if nn else b_q[g].float().t())
                    if epilogue:
                        ref = ref * scale_a[g] * scale_b[0] + bias[g].float()
                    got = d[lay.start[g]:lay.start[g] + m]
                    worst = max(worst, rel(got, ref))
                # The grouped matrix's tail (rows past the filled chunks) is zero.
                tail_zero = bool((d[lay.filled_rows:].float() == 0).all().item())
                tol = 2e-2 if fp8 else 8e-3
                ok = worst < tol and tail_zero
                failures += not ok
                print(f"check {name:20s} splits={splits} k={red} n={out_n} epilogue={epilogue}: "
                      f"rel={worst:.2e} tail-zero={tail_zero} {'ok' if ok else 'FAIL'}")
    return failures


def selected(label, k):
    """The kernel `backend::sm90_grouped` takes for a case (k = reduction length), and its band."""
    fp8 = label.startswith("fp8")
    if label == "fp8 dgrad split":
        return "e4m3_tn_split_128"
    if not fp8:
        return "bf16_nn_256" if "dgrad" in label else "bf16_tn_256"
    return "e4m3_tn_128_pingpong" if -(-k // 128) <= 16 else "e4m3_tn_256"


def band_for(name, n):
    bn = 128 if "_128" in name else 256
    return 16 if -(-n // bn) >= 16 else 1


def events_time(fn, iters):
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / iters * 1e-3


def in_turns(ours, peer, iters, rounds=int(os.environ.get("LOWP_ROUNDS", "5"))):
    """Best time of each side over `rounds` rounds, and the median of the rounds' ratios (peer /
    ours). At the power limit the SM clock follows the GPU's recent load: the first run after a
    pause (the case's setup) is the fastest, so both sides first heat the GPU with one untimed
    run each, and the order within a round alternates (LOWP_ORDER=peer-first keeps the peer
    first in every round, as earlier stops measured)."""
    peer_first_always = os.environ.get("LOWP_ORDER", "alternate") == "peer-first"
    for f in (ours, peer):
        f()
        events_time(f, 2)
    for f in (peer, ours):
        events_time(f, iters)
    best_o, best_p, ratios = float("inf"), float("inf"), []
    for r in range(rounds):
        if peer_first_always or r % 2 == 0:
            tp = events_time(peer, iters)
            to = events_time(ours, iters)
        else:
            to = events_time(ours, iters)
            tp = events_time(peer, iters)
        best_o, best_p = min(best_o, to), min(best_p, tp)
        ratios.append(tp / to)
    return best_o, best_p, statistics.median(ratios)


def timing(kern, shapes, only=None, bands=(1,), pick=False, x2=False):
    for (e, t, k, n) in shapes:
        for skewed in (False, True):
            splits = make_splits(e, t, skewed)
            lay = Layout(splits)
            p_rows = lay.p
            offs = torch.tensor(splits, device="cuda", dtype=torch.int32).cumsum(0, dtype=torch.int32)
            x = torch.randn(t, k, device="cuda", dtype=torch.bfloat16)
            dy = torch.randn(t, n, device="cuda", dtype=torch.bfloat16)
            w = torch.randn(e, n, k, device="cuda", dtype=torch.bfloat16)
            xp, dyp = pack(x, lay.token_rows, p_rows), pack(dy, lay.token_rows, p_rows)
            xq, dyq, wq = x.to(FP8), dy.to(FP8), w.to(FP8)
            wtq = w.transpose(1, 2).contiguous().to(FP8)
            xpq, dypq = xp.to(FP8), dyp.to(FP8)
            y = torch.empty(p_rows, n, device="cuda", dtype=torch.bfloat16)
            dx = torch.empty(p_rows, k, device="cuda", dtype=torch.bfloat16)
            ones = lambda *s: torch.ones(*s, device="cuda", dtype=torch.float32)
            flops = 2.0 * t * n * k
            iters = int(min(max(2e14 / flops, 5), 100))
            per_expert, shared = ones(e), ones(1)
            bf16_f = lambda: torch._grouped_mm(x, w.transpose(-2, -1), offs=offs, out_dtype=torch.bfloat16)
            bf16_d = lambda: torch._grouped_mm(dy, w, offs=offs, out_dtype=torch.bfloat16)
            fp8_f = lambda: torch._scaled_grouped_mm(xq, wq.transpose(-2, -1), ones(t), ones(e, n), offs=offs,
                                                     out_dtype=torch.bfloat16, use_fast_accum=True)
            fp8_d = lambda fast: torch._scaled_grouped_mm(dyq, wtq.transpose(-2, -1), ones(t), ones(e, k),
                                                          offs=offs, out_dtype=torch.bfloat16, use_fast_accum=fast)
            # FP8: the experts' own scales for A (TE's semantics), one shared for B.
            mk = lambda name, a, b, out, on, red, s=False: (
                lambda: kern.launch(name, a, b, out, lay, on, red, per_expert if s else None, shared if s else None))
            cases = []
            for v in kern.ids:
                if v.startswith("e5m2"):
                    continue  # no PyTorch peer takes E5M2 rows with E4M3 weights
                if v.startswith("bf16_tn"):
                    cases.append(("bf16 fprop", v, n, mk(v, xp, w, y, n, k), bf16_f))
                elif v.startswith("bf16_nn"):
                    cases.append(("bf16 dgrad", v, k, mk(v, dyp, w, dx, k, n), bf16_d))
                elif v.startswith("e4m3_tn_split"):
                    cases.append(("fp8 dgrad split", v, k, mk(v, dypq, wtq, dx, k, n, True), lambda: fp8_d(False)))
                else:
                    cases.append(("fp8 fprop fast", v, n, mk(v, xpq, wq, y, n, k, True), fp8_f))
                    cases.append(("fp8 dgrad fast", v, k, mk(v, dypq, wtq, dx, k, n, True), lambda: fp8_d(True)))
            for label, name, out_n, ours, peer in cases:
                if only and not any(o == name for o in only):
                    continue
                red = n if "dgrad" in label else k
                if pick and name not in (selected(label, red), selected(label, red) + ("_x2" if x2 else "")):
                    continue
                for band in ([band_for(name, out_n)] if pick else bands):
                    os.environ["LOWP_BAND"] = str(band)
                    to, tp, median = in_turns(ours, peer, iters)
                    print(f"time E={e} T={t} K={k} N={n} {'skewed' if skewed else 'balanced'} {label:16s} "
                          f"{name:18s} band {band:3d} ours {to*1e6:9.1f} us {flops/to/1e12:7.1f} TF/s  torch "
                          f"{tp*1e6:9.1f} us {flops/tp/1e12:7.1f} TF/s  ratio {tp/to:.3f} median {median:.3f}", flush=True)


# ---- The K-grouped weight gradient ----------------------------------------------------------------

def packed_rows(values, lay, garbage_tail=True):
    """Token rows `values [T, cols]` in the aligned layout `[P, cols]`: padding rows inside an
    expert's range zero (as the crate's dispatch and combine backward write them), the rows past
    the filled chunks garbage (the kernel must never read them)."""
    out = torch.zeros(lay.p, values.shape[1], device="cuda", dtype=values.dtype)
    out[lay.token_rows] = values
    if garbage_tail and lay.p > lay.filled_rows:
        out[lay.filled_rows:] = (1e4 * torch.randn(lay.p - lay.filled_rows, values.shape[1],
                                                   device="cuda")).to(values.dtype)
    return out


def wgrad_operands(name, dy, x, lay, e):
    """The kernel's operands for `name` and the FP32 values the reference multiplies: BF16 as
    stored; FP8 quantized per expert (scale = amax / fp8 max, as current scaling), the kernel
    reading whole transposes and the experts' dequantization scales."""
    dy_p, x_p = packed_rows(dy, lay), packed_rows(x, lay)
    if name.startswith("wgrad_bf16"):
        return dy_p, x_p, dy_p.float(), x_p.float(), None, None
    dy_t = E5M2 if name.startswith("wgrad_e5m2") else FP8
    s_dy = torch.ones(e, device="cuda")
    s_x = torch.ones(e, device="cuda")
    dq = torch.zeros_like(dy_p, dtype=torch.float32)
    xq = torch.zeros_like(x_p, dtype=torch.float32)
    # The codes' values in f32 (exact), cast to FP8 once transposed: no indexing of FP8 tensors.
    dy_codes = torch.zeros_like(dy_p, dtype=torch.float32)
    x_codes = torch.zeros_like(x_p, dtype=torch.float32)
    for g in range(e):
        r0, r1 = lay.start[g], lay.start[g] + lay.aligned[g]
        if r1 == r0:
            continue
        for src, codes, deq, scales, t in ((dy_p, dy_codes, dq, s_dy, dy_t), (x_p, x_codes, xq, s_x, FP8)):
            block = src[r0:r1].float()
            scale = block.abs().max().clamp_min(1e-12) / torch.finfo(t).max
            scales[g] = scale
            c = (block / scale).to(t).float()
            codes[r0:r1] = c
            deq[r0:r1] = c * scale
    # Whole transposes [cols, P] (the tail rows hold zero codes: never read).
    return (dy_codes.t().contiguous().to(dy_t), x_codes.t().contiguous().to(FP8), dq, xq, s_dy, s_x)


def wgrad_check(kern):
    torch.manual_seed(1)
    torch.backends.cuda.matmul.allow_tf32 = False  # the reference in full FP32
    # (splits, M = dY's columns, N = X's columns): empty experts, a 1-row expert, row and column
    # tails (M, N not multiples of the tile), and the fine-grained MoE's fc2 shape at E = 64.
    cases = [([300, 0, 517, 1, 130], 320, 200), ([0, 700, 129, 0, 2048, 64], 256, 512),
             (make_splits(64, 16384, True), 2048, 1024)]
    failures = 0
    for splits, m, n in cases:
        e = len(splits)
        lay = Layout(splits)
        t = sum(splits)
        dy = torch.randn(t, m, device="cuda").bfloat16()
        x = torch.randn(t, n, device="cuda").bfloat16()
        for name in kern.wgrad_ids:
            a, b, a_ref, b_ref, s_a, s_b = wgrad_operands(name, dy, x, lay, e)
            fp8 = not name.startswith("wgrad_bf16")
            fast = fp8 and "split" not in name
            ref = torch.zeros(e, m, n, device="cuda")
            for g in range(e):
                r0, r1 = lay.start[g], lay.start[g] + lay.aligned[g]
                if r1 > r0:
                    ref[g] = a_ref[r0:r1].t() @ b_ref[r0:r1]
            for f32, accumulate in ((True, False), (False, False), (True, True)):
                if f32:
                    init = torch.randn(e, m, n, device="cuda") if accumulate else \
                        torch.full((e, m, n), float("nan"), device="cuda")
                else:
                    init = torch.full((e, m, n), float("nan"), device="cuda").bfloat16()
                d = init.clone()
                kern.wgrad(name, a, b, d, lay, m, n, s_a, s_b, f32=f32, accumulate=accumulate)
                torch.cuda.synchronize()
                worst, empty_ok = 0.0, True
                for g in range(e):
                    if lay.aligned[g] == 0:
                        # Untouched when accumulating, else zeros.
                        want = init[g] if accumulate else torch.zeros_like(d[g])
                        empty_ok &= bool(torch.equal(d[g], want))
                        continue
                    got = d[g].float() - (init[g] if accumulate else 0.0)
                    worst = max(worst, rel(got, ref[g]))
                # BF16 products are exact in FP32; FP8 sums in the tensor core's reduced precision
                # within an instruction (split) or across the whole K loop (fast accumulation).
                tol = 8e-3 if not f32 else (2e-2 if fast else (2e-3 if fp8 else 1e-4))
                ok = worst < tol and empty_ok
                failures += not ok
                mode = "f32 accumulate" if accumulate else ("f32" if f32 else "bf16")
                print(f"wgrad check {name:22s} E={e} T={t} M={m} N={n} {mode:14s}: rel={worst:.2e} "
                      f"(bound {tol:.0e}) empty-experts={'ok' if empty_ok else 'WRONG'} "
                      f"{'ok' if ok else 'FAIL'}", flush=True)
    return failures


def graphed(fn):
    """`fn` replayed from a CUDA graph (one launch of the whole per-expert loop: the GPU's time,
    not Python's), or `fn` itself where capture fails."""
    try:
        fn()
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()
        return graph.replay, "graph"
    except Exception as err:  # noqa: BLE001 - report and fall back to eager launches
        print(f"  (CUDA graph capture failed, timing eager launches: {err})")
        return fn, "eager"


def try_peer(label, fn):
    """A peer that this PyTorch may lack or refuse: `fn` if one call runs, else None."""
    try:
        fn()
        torch.cuda.synchronize()
        return fn
    except Exception as err:  # noqa: BLE001 - a missing peer is reported, not fatal
        print(f"  {label}: unavailable ({type(err).__name__}: {str(err).splitlines()[0][:160]})")
        return None


def wgrad_timing(kern, shapes):
    for (e, t, m, n) in shapes:
        for skewed in (False, True):
            splits = make_splits(e, t, skewed)
            lay = Layout(splits)
            rows = lay.filled_rows
            offs = torch.tensor([lay.start[g] + lay.aligned[g] for g in range(e)], device="cuda",
                                dtype=torch.int32)
            dy = torch.randn(t, m, device="cuda").bfloat16()
            x = torch.randn(t, n, device="cuda").bfloat16()
            dy_p, x_p = packed_rows(dy, lay, False), packed_rows(x, lay, False)
            # FP8 operands (one scale for all experts is enough for timing): whole transposes.
            dyt_q = dy_p.t().contiguous().to(FP8)
            xt_q = x_p.t().contiguous().to(FP8)
            dyt_q5 = dy_p.t().contiguous().to(E5M2)
            ones_e = torch.ones(e, device="cuda")
            one = torch.ones((), device="cuda")
            flops = 2.0 * t * m * n
            iters = int(min(max(2e14 / flops, 5), 100))
            split_label = "skewed" if skewed else "balanced"
            dw_f32 = torch.zeros(e, m, n, device="cuda")
            dw_bf16 = torch.empty(e, m, n, device="cuda", dtype=torch.bfloat16)
            experts = [g for g in range(e) if lay.aligned[g] > 0]
            ranges = [(lay.start[g], lay.start[g] + lay.aligned[g]) for g in experts]

            def loop_bf16():
                for g, (r0, r1) in zip(experts, ranges):
                    torch.mm(dy_p[r0:r1].t(), x_p[r0:r1], out=dw_bf16[g])

            def loop_fp8(fast):
                def run():
                    for r0, r1 in ranges:
                        torch._scaled_mm(dyt_q[:, r0:r1], xt_q[:, r0:r1].t(), scale_a=one, scale_b=one,
                                         out_dtype=torch.bfloat16, use_fast_accum=fast)
                return run

            peers_bf16 = []
            fn, how = graphed(loop_bf16)
            peers_bf16.append((f"torch per-expert mm ({how})", fn))
            # The K-grouped form: dY as its transpose's view or a transposed copy (whichever
            # layout this PyTorch takes).
            dyt_bf16 = dy_p[:rows].t().contiguous()
            gm = try_peer("torch._grouped_mm 2d x 2d (dY.t() view)", lambda: torch._grouped_mm(
                dy_p[:rows].t(), x_p[:rows], offs=offs, out_dtype=torch.bfloat16))
            gm = gm or try_peer("torch._grouped_mm 2d x 2d (dYᵀ copy)", lambda: torch._grouped_mm(
                dyt_bf16, x_p[:rows], offs=offs, out_dtype=torch.bfloat16))
            if gm:
                peers_bf16.append(("torch._grouped_mm", gm))
            peers_fp8 = {}
            for fast in (False, True):
                fn = try_peer(f"torch._scaled_mm loop (fast={fast})", loop_fp8(fast))
                if fn:
                    fn, how = graphed(fn)
                    peers_fp8[fast] = [(f"torch per-expert _scaled_mm ({how})", fn)]
                else:
                    peers_fp8[fast] = []
                sgm = try_peer(f"torch._scaled_grouped_mm 2d x 2d (fast={fast})",
                               lambda fast=fast: torch._scaled_grouped_mm(
                                   dyt_q[:, :rows], xt_q[:, :rows].t(),
                                   torch.ones(e * m, device="cuda"), torch.ones(e * n, device="cuda"),
                                   offs=offs, out_dtype=torch.bfloat16, use_fast_accum=fast))
                if sgm:
                    peers_fp8[fast].append(("torch._scaled_grouped_mm", sgm))

            def ours(name, a, b, f32=True, accumulate=False, scales=False):
                d = dw_f32 if f32 else dw_bf16
                s = ones_e if scales else None
                return lambda: kern.wgrad(name, a, b, d, lay, m, n, s, s, f32=f32, accumulate=accumulate)

            cases = [
                ("bf16 -> bf16", ours("wgrad_bf16_256", dy_p, x_p, f32=False), peers_bf16),
                ("bf16 -> f32", ours("wgrad_bf16_256", dy_p, x_p), peers_bf16),
                ("bf16 += f32", ours("wgrad_bf16_256", dy_p, x_p, accumulate=True), peers_bf16),
                ("e4m3 split -> f32", ours("wgrad_e4m3_split_128", dyt_q, xt_q, scales=True), peers_fp8[False]),
                ("e4m3 split -> bf16", ours("wgrad_e4m3_split_128", dyt_q, xt_q, f32=False, scales=True),
                 peers_fp8[False]),
                ("e5m2 split += f32", ours("wgrad_e5m2_split_128", dyt_q5, xt_q, accumulate=True, scales=True),
                 peers_fp8[False]),
                ("e4m3 fast -> bf16", ours("wgrad_e4m3_256", dyt_q, xt_q, f32=False, scales=True), peers_fp8[True]),
                ("e5m2 fast -> f32", ours("wgrad_e5m2_256", dyt_q5, xt_q, scales=True), peers_fp8[True]),
            ]
            for label, mine, peers in cases:
                if not peers:
                    to = events_time(mine, iters)
                    print(f"wgrad time E={e} T={t} M={m} N={n} {split_label} {label:20s} ours {to*1e6:9.1f} us "
                          f"{flops/to/1e12:7.1f} TF/s  (no peer)", flush=True)
                for peer_label, peer in peers:
                    to, tp, median = in_turns(mine, peer, iters)
                    print(f"wgrad time E={e} T={t} M={m} N={n} {split_label} {label:20s} ours {to*1e6:9.1f} us "
                          f"{flops/to/1e12:7.1f} TF/s  {peer_label} {tp*1e6:9.1f} us {flops/tp/1e12:7.1f} TF/s  "
                          f"ratio {tp/to:.3f} median {median:.3f}", flush=True)


def find_nvcc():
    """nvcc from CUDA_HOME, PATH, or the pip package nvidia-cuda-nvcc (site-packages)."""
    import glob
    import shutil
    import site
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    if home and os.path.exists(os.path.join(home, "bin", "nvcc")):
        return os.path.join(home, "bin", "nvcc")
    if shutil.which("nvcc"):
        return shutil.which("nvcc")
    for d in site.getsitepackages() + [site.getusersitepackages(), "/usr/local/cuda"]:
        found = sorted(glob.glob(os.path.join(d, "nvidia", "cu*", "bin", "nvcc"))
                       + glob.glob(os.path.join(d, "nvidia", "cuda_nvcc", "bin", "nvcc"))
                       + glob.glob(os.path.join(d, "bin", "nvcc")))
        if found:
            return found[-1]
    sys.exit("--build: no nvcc (set CUDA_HOME, put nvcc on PATH, or pip install nvidia-cuda-nvcc)")


def build():
    """harness.cu -> a temporary libprobe.so (README command; the driver library linked by name,
    else by the path of the libcuda.so.1 the process can load)."""
    import ctypes.util
    import subprocess
    import tempfile
    here = os.path.dirname(os.path.abspath(__file__))
    out = os.path.join(tempfile.mkdtemp(prefix="sm90_probe_"), "libprobe.so")
    nvcc = find_nvcc()
    cmd = [nvcc, "-O3", "-std=c++17", "-shared", "-Xcompiler", "-fPIC",
           "-gencode=arch=compute_90a,code=sm_90a", "-o", out, os.path.join(here, "harness.cu")]
    print("build:", " ".join(cmd + ["-lcuda"]), flush=True)
    r = subprocess.run(cmd + ["-lcuda"], capture_output=True, text=True)
    if r.returncode != 0:
        lib = ctypes.util.find_library("cuda")
        candidates = [p for p in ("/usr/lib/x86_64-linux-gnu/libcuda.so.1", "/usr/lib64/libcuda.so.1",
                                  "/usr/local/cuda/lib64/stubs/libcuda.so") if os.path.exists(p)]
        target = candidates[0] if candidates else lib
        print(f"build: -lcuda failed, linking {target}\n{r.stderr[-2000:]}", flush=True)
        if target is None:
            sys.exit("build failed: no libcuda")
        r = subprocess.run(cmd + [target], capture_output=True, text=True)
        if r.returncode != 0:
            sys.exit(f"build failed:\n{r.stderr[-4000:]}")
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("lib", nargs="?", help="a built libprobe.so (or --build)")
    ap.add_argument("--build", action="store_true", help="compile harness.cu with nvcc first")
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--time", action="store_true")
    ap.add_argument("--only", nargs="*")
    ap.add_argument("--bands", default="1")
    ap.add_argument("--selected", action="store_true", help="only the kernel and band the crate picks")
    ap.add_argument("--x2", action="store_true", help="with --selected: its cluster (_x2) twin too")
    ap.add_argument("--shapes", nargs="*", default=["8,32768,7168,2048", "16,32768,2048,768", "128,65536,2048,1536"])
    ap.add_argument("--wgrad", action="store_true", help="check and time the K-grouped weight gradient")
    ap.add_argument("--wgrad-no-time", action="store_true", help="with --wgrad: the checks only")
    ap.add_argument("--wgrad-shapes", nargs="*", default=["64,65536,2048,2048", "64,65536,2048,1024"],
                    help="E,T,M,N: experts, assignment rows of a micro-batch, dW_e [M, N]")
    args = ap.parse_args()
    if args.build:
        args.lib = build()
    if not args.lib:
        ap.error("give LIB or --build")
    kern = Kernels(args.lib)
    failures = check(kern) if args.check else 0
    if args.wgrad:
        if not kern.wgrad_ids:
            sys.exit(f"{args.lib} has no wgrad kernels: rebuild it from this harness.cu")
        failures += wgrad_check(kern)
    if args.time:
        timing(kern, [tuple(int(v) for v in s.split(",")) for s in args.shapes], args.only,
               [int(b) for b in args.bands.split(",")], args.selected, args.x2)
    if args.wgrad and not args.wgrad_no_time:
        wgrad_timing(kern, [tuple(int(v) for v in s.split(",")) for s in args.wgrad_shapes])
    print(f"failures: {failures}")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
