"""Runs one kernel back to back for a few seconds while nvidia-smi samples SM clock and power:
ours (bf16_tn_256[_x2]) and torch._grouped_mm on E=8 T=32768 K=7168 N=2048, balanced."""
import os, subprocess, sys, time
sys.path.insert(0, "benches/sm90_probe"); sys.path.insert(0, "benches")
import torch
from probe import Kernels, Layout, pack
from grouped_torch import make_splits
kern = Kernels("benches/sm90_probe/libprobe.so")
e, t, k, n = 8, 32768, 7168, 2048
mode = sys.argv[1]
splits = make_splits(e, t, False); lay = Layout(splits)
offs = torch.tensor(splits, device="cuda", dtype=torch.int32).cumsum(0, dtype=torch.int32)
x = torch.randn(t, k, device="cuda", dtype=torch.bfloat16); w = torch.randn(e, n, k, device="cuda", dtype=torch.bfloat16)
dy = torch.randn(t, n, device="cuda", dtype=torch.bfloat16)
xp = pack(x, lay.token_rows, lay.p); dyp = pack(dy, lay.token_rows, lay.p)
y = torch.empty(lay.p, n, device="cuda", dtype=torch.bfloat16); dx = torch.empty(lay.p, k, device="cuda", dtype=torch.bfloat16)
os.environ["LOWP_BAND"] = "1"
fns = {
  "torch": lambda: torch._grouped_mm(x, w.transpose(-2, -1), offs=offs, out_dtype=torch.bfloat16),
  "ours": lambda: kern.launch("bf16_tn_256", xp, w, y, lay, n, k),
  "ours_x2": lambda: kern.launch("bf16_tn_256_x2", xp, w, y, lay, n, k),
  "torch_dgrad": lambda: torch._grouped_mm(dy, w, offs=offs, out_dtype=torch.bfloat16),
  "ours_dgrad": lambda: kern.launch("bf16_nn_256", dyp, w, dx, lay, k, n),
}
fn = fns[mode]
for _ in range(3): fn()
torch.cuda.synchronize()
if os.environ.get("NCU"):
    fn(); torch.cuda.synchronize(); sys.exit(0)
smi = subprocess.Popen(["nvidia-smi", "--query-gpu=clocks.sm,power.draw,temperature.gpu", "--format=csv,noheader,nounits", "-lms", "100"], stdout=subprocess.PIPE, text=True)
t0 = time.time(); iters = 0
start = torch.cuda.Event(enable_timing=True); end = torch.cuda.Event(enable_timing=True)
start.record()
while time.time() - t0 < 4.0:
    for _ in range(20): fn()
    iters += 20
    torch.cuda.synchronize()
end.record(); end.synchronize()
smi.terminate(); out = smi.communicate()[0].strip().splitlines()
vals = [[float(v) for v in l.split(",")] for l in out[5:] if l.count(",") == 2]
ms = start.elapsed_time(end) / iters
clk = sum(v[0] for v in vals) / len(vals); pw = sum(v[1] for v in vals) / len(vals); tmp = max(v[2] for v in vals)
print(f"{mode:12s} {ms*1000:8.1f} us/iter {2*t*n*k/ms/1e9:7.1f} TF/s  sm clock {clk:6.0f} MHz  power {pw:5.0f} W  temp<= {tmp:.0f} C  samples {len(vals)}")
