#!/usr/bin/env python3
"""What a cuBLASLt pointer-array grouped GEMM's speed depends on, on this machine's GPU.

The grouped GEMM of burn-lowp (`backend::cuda`'s grouped GEMM) runs the experts as one cuBLASLt
POINTER_ARRAY batch of 128-row chunks. This probe builds the same batch with PyTorch tensors and
ctypes (the cuBLASLt that PyTorch loaded) and times, for each descriptor variant, every algorithm
cuBLASLt's heuristic proposes: with and without `CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET` = SMs - 1
(what our descriptors set under the device-flag ordering, docs/gemm-paths.md), with a 32 MiB and a
64 MiB workspace, on the exact batch (the chunks the splits fill) and on the bound
((T + 127 E) / 128 chunks). `torch._grouped_mm` on the same operands is the peer.

Prints one JSON line per measurement: python3 pointer_array_algos.py [--interleaved]
(`--interleaved`: the 8-expert fprop's torch and pointer-array runs in turn, eight rounds)."""
import ctypes
import json
import sys
import torch

dev = torch.device("cuda")
c_p = ctypes.c_void_p
OP_N, OP_T = 0, 1
R_16BF = 14
COMPUTE_32F, R_32F = 68, 0
D_TRANSA, D_TRANSB, D_SM_COUNT_TARGET = 3, 4, 15
L_BATCH_COUNT, L_BATCH_MODE, BATCH_POINTER_ARRAY = 5, 8, 1
P_MAX_WS = 1
CHUNK = 128


class HeurResult(ctypes.Structure):
    _fields_ = [("algo", ctypes.c_uint64 * 8), ("workspaceSize", ctypes.c_size_t),
                ("state", ctypes.c_int), ("wavesCount", ctypes.c_float), ("reserved", ctypes.c_int * 4)]


def loaded(name):
    for line in open("/proc/self/maps"):
        if name in line and ".so" in line:
            return line.split()[-1]
    return None


def log(d):
    print(json.dumps(d), flush=True)


def bench(fn, iters=10, warm=3):
    for _ in range(warm):
        fn()
    torch.cuda.synchronize()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    best = float("inf")
    for _ in range(3):
        s.record()
        for _ in range(iters):
            fn()
        e.record()
        torch.cuda.synchronize()
        best = min(best, s.elapsed_time(e) / iters)
    return best * 1e-3


class Lt:
    def __init__(self, path):
        self.l = l = ctypes.CDLL(path)
        l.cublasLtMatrixLayoutCreate.argtypes = [c_p, ctypes.c_int, ctypes.c_uint64, ctypes.c_uint64, ctypes.c_int64]
        for fn in ("cublasLtMatmulDescSetAttribute", "cublasLtMatrixLayoutSetAttribute",
                   "cublasLtMatmulPreferenceSetAttribute"):
            getattr(l, fn).argtypes = [c_p, ctypes.c_int, c_p, ctypes.c_size_t]
        l.cublasLtMatmulDescCreate.argtypes = [c_p, ctypes.c_int, ctypes.c_int]
        l.cublasLtMatmulAlgoGetHeuristic.argtypes = [c_p] * 7 + [ctypes.c_int, c_p, c_p]
        l.cublasLtMatmul.argtypes = [c_p] * 14 + [ctypes.c_size_t, c_p]
        self.h = c_p()
        assert l.cublasLtCreate(ctypes.byref(self.h)) == 0
        self.ws = torch.empty(64 << 20, dtype=torch.uint8, device=dev)

    def layout(self, rows, cols, ld, batch):
        lay = c_p()
        assert self.l.cublasLtMatrixLayoutCreate(ctypes.byref(lay), R_16BF, rows, cols, ld) == 0
        for attr, v in ((L_BATCH_COUNT, ctypes.c_int32(batch)), (L_BATCH_MODE, ctypes.c_int32(BATCH_POINTER_ARRAY))):
            assert self.l.cublasLtMatrixLayoutSetAttribute(lay, attr, ctypes.byref(v), ctypes.sizeof(v)) == 0
        return lay

    def candidates(self, transa, m, n, k, lda, batch, sm_target, ws_bytes):
        """(desc, layouts, [(algo, workspace)]) of D[m, n] = op(A)[m, k] · B[k, n], column-major."""
        desc = c_p()
        assert self.l.cublasLtMatmulDescCreate(ctypes.byref(desc), COMPUTE_32F, R_32F) == 0
        attrs = [(D_TRANSA, ctypes.c_int32(transa)), (D_TRANSB, ctypes.c_int32(OP_N))]
        if sm_target:
            attrs.append((D_SM_COUNT_TARGET, ctypes.c_int32(sm_target)))
        for attr, v in attrs:
            assert self.l.cublasLtMatmulDescSetAttribute(desc, attr, ctypes.byref(v), ctypes.sizeof(v)) == 0
        a = self.layout(*((k, m) if transa == OP_T else (m, k)), lda, batch)
        b = self.layout(k, n, k, batch)
        d = self.layout(m, n, m, batch)
        pref = c_p()
        assert self.l.cublasLtMatmulPreferenceCreate(ctypes.byref(pref)) == 0
        v = ctypes.c_uint64(ws_bytes)
        assert self.l.cublasLtMatmulPreferenceSetAttribute(pref, P_MAX_WS, ctypes.byref(v), 8) == 0
        results = (HeurResult * 8)()
        count = ctypes.c_int(0)
        st = self.l.cublasLtMatmulAlgoGetHeuristic(self.h, desc, a, b, d, d, pref, 8,
                                                   ctypes.cast(results, c_p), ctypes.cast(ctypes.pointer(count), c_p))
        assert st == 0, st
        return desc, (a, b, d), [results[i] for i in range(count.value) if results[i].state == 0]

    def run(self, desc, lays, algo, a, b, d, ws_bytes):
        one, zero = ctypes.c_float(1.0), ctypes.c_float(0.0)
        st = self.l.cublasLtMatmul(self.h, desc, ctypes.byref(one), c_p(a), lays[0], c_p(b), lays[1],
                                   ctypes.byref(zero), c_p(d), lays[2], c_p(d), lays[2],
                                   ctypes.byref(algo.algo), c_p(self.ws.data_ptr()), ws_bytes,
                                   c_p(torch.cuda.current_stream().cuda_stream))
        assert st == 0, st


def case(lt, sms, experts, tokens, k, n, gemm):
    """fprop: Y[T, n] = X[T, k] · W_e[n, k]ᵀ; dgrad: dX[T, k] = dY[T, n] · W_e[n, k]."""
    torch.manual_seed(0)
    split = tokens // experts
    w = torch.randn(experts, n, k, device=dev, dtype=torch.bfloat16) * 0.02
    inner, outer = (k, n) if gemm == "fprop" else (n, k)
    x = torch.randn(tokens, inner, device=dev, dtype=torch.bfloat16)
    y = torch.empty(tokens + experts * CHUNK, outer, device=dev, dtype=torch.bfloat16)
    offs = torch.arange(1, experts + 1, device=dev, dtype=torch.int32) * split
    peer = (lambda: torch._grouped_mm(x, w.transpose(1, 2), offs=offs)) if gemm == "fprop" else \
        (lambda: torch._grouped_mm(x, w, offs=offs))
    flops = 2 * tokens * k * n
    base = {"experts": experts, "tokens": tokens, "k": k, "n": n, "gemm": gemm}
    log({**base, "impl": "torch._grouped_mm", "tflops": round(flops / bench(peer) / 1e12, 1)})
    exact = tokens // CHUNK
    bound = (tokens + (CHUNK - 1) * experts) // CHUNK
    ar = torch.arange(bound, device=dev, dtype=torch.int64)
    esz = 2
    e_of = (ar // (split // CHUNK)).clamp(max=experts - 1)
    a_ptrs = w.data_ptr() + e_of * n * k * esz
    b_ptrs = x.data_ptr() + (ar * CHUNK).clamp(max=tokens - CHUNK) * inner * esz
    d_ptrs = y.data_ptr() + ar * CHUNK * outer * esz
    # cuBLAS A is the weight: [n, k] row-major is column-major [k, n] ld k; fprop takes its
    # transpose (m = n), dgrad takes it as is (m = k).
    transa, lda = (OP_T, k) if gemm == "fprop" else (OP_N, k)
    for batch_name, batch in (("exact", exact), ("bound", bound)):
        for sm_target in (None, sms - 1):
            for ws in (32 << 20, 64 << 20):
                desc, lays, algos = lt.candidates(transa, outer, CHUNK, inner, lda, batch, sm_target, ws)
                times = []
                for i, r in enumerate(algos):
                    t = bench(lambda: lt.run(desc, lays, r, a_ptrs.data_ptr(), b_ptrs.data_ptr(),
                                             d_ptrs.data_ptr(), ws))
                    times.append(round(flops / t / 1e12, 1))
                log({**base, "impl": "pointer array", "batch": batch_name, "sm_target": sm_target,
                     "workspace_mib": ws >> 20, "tflops_per_candidate": times,
                     "algo_ids": [list(r.algo)[:2] for r in algos]})


def interleaved(lt, sms, experts, tokens, k, n, rounds):
    """fprop: torch._grouped_mm and the pointer array's first algorithm (with and without the SM
    target) timed in turn, `rounds` times: how far one measurement moves from the next."""
    split = tokens // experts
    w = torch.randn(experts, n, k, device=dev, dtype=torch.bfloat16) * 0.02
    x = torch.randn(tokens, k, device=dev, dtype=torch.bfloat16)
    y = torch.empty(tokens, n, device=dev, dtype=torch.bfloat16)
    offs = torch.arange(1, experts + 1, device=dev, dtype=torch.int32) * split
    flops = 2 * tokens * k * n
    count = tokens // CHUNK
    ar = torch.arange(count, device=dev, dtype=torch.int64)
    a_ptrs = w.data_ptr() + (ar // (split // CHUNK)) * n * k * 2
    b_ptrs = x.data_ptr() + ar * CHUNK * k * 2
    d_ptrs = y.data_ptr() + ar * CHUNK * n * 2
    runs = {"torch._grouped_mm": lambda: torch._grouped_mm(x, w.transpose(1, 2), offs=offs)}
    for sm_target in (None, sms - 1):
        desc, lays, algos = lt.candidates(OP_T, n, CHUNK, k, k, count, sm_target, 32 << 20)
        runs[f"pointer array sm_target={sm_target}"] = (
            lambda desc=desc, lays=lays, r=algos[0]:
            lt.run(desc, lays, r, a_ptrs.data_ptr(), b_ptrs.data_ptr(), d_ptrs.data_ptr(), 32 << 20))
    for i in range(rounds):
        for name, fn in runs.items():
            log({"round": i, "impl": name, "experts": experts, "tokens": tokens, "k": k, "n": n,
                 "tflops": round(flops / bench(fn) / 1e12, 1)})


def main():
    torch.mm(torch.randn(64, 64, device=dev), torch.randn(64, 64, device=dev))
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    lt = Lt(loaded("libcublasLt"))
    log({"gpu": torch.cuda.get_device_name(), "sms": sms, "torch": torch.__version__})
    if len(sys.argv) > 1 and sys.argv[1] == "--interleaved":
        interleaved(lt, sms, 8, 32768, 7168, 2048, 8)
        return
    for experts, tokens, k, n in ((8, 32768, 7168, 2048), (128, 65536, 2048, 1536), (16, 32768, 2048, 768)):
        for gemm in ("fprop", "dgrad"):
            case(lt, sms, experts, tokens, k, n, gemm)


if __name__ == "__main__":
    main()
