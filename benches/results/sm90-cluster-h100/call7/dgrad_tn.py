"""BF16 dgrad as the TN kernel over a transposed weight copy ([E, K, N], K-major for the
reduction over N) against the NN kernel over W as stored, in turns with torch._grouped_mm."""
import os, sys
sys.path.insert(0, "benches/sm90_probe"); sys.path.insert(0, "benches")
import torch
from probe import Kernels, Layout, pack, in_turns, band_for
from grouped_torch import make_splits
kern = Kernels("benches/sm90_probe/libprobe.so")
for (e, t, k, n) in [(8, 32768, 7168, 2048), (16, 32768, 2048, 768), (128, 65536, 2048, 1536)]:
    for skewed in (False, True):
        splits = make_splits(e, t, skewed); lay = Layout(splits)
        offs = torch.tensor(splits, device="cuda", dtype=torch.int32).cumsum(0, dtype=torch.int32)
        w = torch.randn(e, n, k, device="cuda", dtype=torch.bfloat16)
        wt = w.transpose(1, 2).contiguous()  # [E, K, N]
        dy = torch.randn(t, n, device="cuda", dtype=torch.bfloat16)
        dyp = pack(dy, lay.token_rows, lay.p)
        dx = torch.empty(lay.p, k, device="cuda", dtype=torch.bfloat16)
        peer = lambda: torch._grouped_mm(dy, w, offs=offs, out_dtype=torch.bfloat16)
        flops = 2.0 * t * n * k; iters = int(min(max(2e14 / flops, 5), 100))
        ref = None
        for name in ("bf16_nn_256", "bf16_nn_128_pingpong", "bf16_tn_256", "bf16_tn_128_pingpong"):
            b = w if "_nn_" in name else wt
            os.environ["LOWP_BAND"] = str(band_for(name, k))
            ours = lambda: kern.launch(name, dyp, b, dx, lay, k, n)
            ours(); torch.cuda.synchronize()
            got = dx[lay.token_rows].float()
            if ref is None: ref = got.clone()
            err = ((got - ref).norm() / ref.norm()).item()
            to, tp = in_turns(ours, peer, iters)
            print(f"dgrad E={e} {'skewed' if skewed else 'balanced'} {name:22s} ours {to*1e6:8.1f} us {flops/to/1e12:6.1f} TF/s torch {tp*1e6:8.1f} us {flops/tp/1e12:6.1f} ratio {tp/to:.3f} rel-vs-first {err:.1e}", flush=True)
        if e == 8 and not skewed:
            tr = lambda: w.transpose(1, 2).contiguous()
            to, tp = in_turns(tr, tr, 5)
            print(f"transpose of W [E={e}, {n}, {k}] bf16: {to*1e6:.1f} us", flush=True)
