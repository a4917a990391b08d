"""Kernel builds against each other in turns: python3 ab.py NAME=LIB ... (the first is the base).
Each case (the crate's selected kernel per GEMM) runs every build in rotation after a heating
run, LOWP_ROUNDS rounds, the rotation's start moving each round; prints each build's best time
and the median over rounds of base time / its time."""
import os, statistics, sys
sys.path.insert(0, "benches/sm90_probe"); sys.path.insert(0, "benches")
import torch
from probe import Kernels, Layout, pack, selected, band_for, events_time, FP8
from grouped_torch import make_splits
libs = [(a.split("=")[0], Kernels(a.split("=")[1])) for a in sys.argv[1:]]
rounds = int(os.environ.get("LOWP_ROUNDS", "4"))
for (e, t, k, n) in [(8, 32768, 7168, 2048), (16, 32768, 2048, 768), (128, 65536, 2048, 1536)]:
    for skewed in (False, True):
        splits = make_splits(e, t, skewed); lay = Layout(splits)
        x = torch.randn(t, k, device="cuda", dtype=torch.bfloat16); dy = torch.randn(t, n, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(e, n, k, device="cuda", dtype=torch.bfloat16)
        xp, dyp = pack(x, lay.token_rows, lay.p), pack(dy, lay.token_rows, lay.p)
        wq, wtq = w.to(FP8), w.transpose(1, 2).contiguous().to(FP8)
        xpq, dypq = xp.to(FP8), dyp.to(FP8)
        y = torch.empty(lay.p, n, device="cuda", dtype=torch.bfloat16); dx = torch.empty(lay.p, k, device="cuda", dtype=torch.bfloat16)
        pe, sh = torch.ones(e, device="cuda"), torch.ones(1, device="cuda")
        flops = 2.0 * t * n * k
        iters = int(min(max(1e14 / flops, 5), 100))
        cases = [("bf16 fprop", xp, w, y, n, k, False), ("bf16 dgrad", dyp, w, dx, k, n, False),
                 ("fp8 fprop fast", xpq, wq, y, n, k, True), ("fp8 dgrad fast", dypq, wtq, dx, k, n, True),
                 ("fp8 dgrad split", dypq, wtq, dx, k, n, True)]
        only = os.environ.get("LOWP_AB_CASES")
        for label, a, b, out, on, red, s in cases:
            if only and label not in only.split(","):
                continue
            name = selected(label, red)
            os.environ["LOWP_BAND"] = str(band_for(name, on))
            fns = [(lab, (lambda kern=kern: kern.launch(name, a, b, out, lay, on, red, pe if s else None, sh if s else None))) for lab, kern in libs]
            for _, f in fns:
                f(); events_time(f, iters)
            times = {lab: [] for lab, _ in fns}
            for r in range(rounds):
                order = fns[r % len(fns):] + fns[:r % len(fns)]
                for lab, f in order:
                    times[lab].append(events_time(f, iters))
            base = libs[0][0]
            line = f"ab E={e} {'skewed' if skewed else 'balanced'} {label:15s} {name:18s}"
            for lab, _ in fns:
                med = statistics.median(tb / tl for tb, tl in zip(times[base], times[lab]))
                line += f"  {lab} {min(times[lab])*1e6:8.1f} us {flops/min(times[lab])/1e12:6.1f} TF/s x{med:.3f}"
            print(line, flush=True)
