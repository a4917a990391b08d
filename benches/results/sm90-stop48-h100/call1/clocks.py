"""Per-tile clock64 breakdown of the cooperative kernels (instrumented copy gg_clock.cu): per
consumer warpgroup, cycles between tiles, waiting for a tile's first stage, waiting for later
stages, in the mainloop (per k-block) and in the epilogue."""
import ctypes, os, sys
sys.path.insert(0, "benches/sm90_probe"); sys.path.insert(0, "benches")
import torch
from probe import Kernels, Layout, pack, band_for
from grouped_torch import make_splits
kern = Kernels(sys.argv[1])
fetch = kern.lib.lowp_probe_tile_clocks
buf = (ctypes.c_ulonglong * 8)()
for (e, t, k, n) in [(8, 32768, 7168, 2048), (16, 32768, 2048, 768), (128, 65536, 2048, 1536)]:
    splits = make_splits(e, t, False); lay = Layout(splits)
    w = torch.randn(e, n, k, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(t, k, device="cuda", dtype=torch.bfloat16); dy = torch.randn(t, n, device="cuda", dtype=torch.bfloat16)
    xp = pack(x, lay.token_rows, lay.p); dyp = pack(dy, lay.token_rows, lay.p)
    y = torch.empty(lay.p, n, device="cuda", dtype=torch.bfloat16); dx = torch.empty(lay.p, k, device="cuda", dtype=torch.bfloat16)
    for label, name, a, out, on, red in (("fprop", "bf16_tn_256", xp, y, n, k), ("dgrad", "bf16_nn_256", dyp, dx, k, n)):
        os.environ["LOWP_BAND"] = str(band_for(name, on))
        f = lambda: kern.launch(name, a, w, out, lay, on, red)
        for _ in range(3): f()
        fetch(buf)
        ev0, ev1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        ev0.record()
        for _ in range(5): f()
        ev1.record(); ev1.synchronize()
        ms = ev0.elapsed_time(ev1) / 5
        fetch(buf)
        tiles, gap, first, wait, main, epi, kbs = [float(v) for v in buf[:7]]
        per = lambda v: v / tiles
        print(f"E={e:3d} {label} {name:12s} {ms*1e3:7.1f} us  tiles/wg {tiles/5/264:.1f}  k-blocks/tile {kbs/tiles:.0f}: "
              f"gap {per(gap):6.0f}  first-wait {per(first):6.0f}  later waits {per(wait):6.0f} ({wait/kbs:4.0f}/kb)  "
              f"mainloop {per(main):7.0f} ({main/kbs:5.0f}/kb)  epilogue {per(epi):6.0f} cycles", flush=True)
