"""Runs one kernel back to back for a few seconds while nvidia-smi samples SM clock and power:
python3 steady.py MODE E,T,K,N. MODE: ours | ours_x2 | torch (fprop) or *_dgrad; balanced splits.
With NCU=1 it runs the kernel once after warming up (for Nsight Compute)."""
import os, subprocess, sys, time
sys.path.insert(0, "benches/sm90_probe"); sys.path.insert(0, "benches")
import torch
from probe import Kernels, Layout, pack, band_for
from grouped_torch import make_splits
kern = Kernels("benches/sm90_probe/libprobe.so")
mode = sys.argv[1]
e, t, k, n = (int(v) for v in sys.argv[2].split(","))
splits = make_splits(e, t, False); lay = Layout(splits)
offs = torch.tensor(splits, device="cuda", dtype=torch.int32).cumsum(0, dtype=torch.int32)
x = torch.randn(t, k, device="cuda", dtype=torch.bfloat16); w = torch.randn(e, n, k, device="cuda", dtype=torch.bfloat16)
dy = torch.randn(t, n, device="cuda", dtype=torch.bfloat16)
xp = pack(x, lay.token_rows, lay.p); dyp = pack(dy, lay.token_rows, lay.p)
y = torch.empty(lay.p, n, device="cuda", dtype=torch.bfloat16); dx = torch.empty(lay.p, k, device="cuda", dtype=torch.bfloat16)
def ours(name, a, out, on, red):
    os.environ["LOWP_BAND"] = str(band_for(name, on))
    return lambda: kern.launch(name, a, w, out, lay, on, red)
fns = {
  "torch": lambda: torch._grouped_mm(x, w.transpose(-2, -1), offs=offs, out_dtype=torch.bfloat16),
  "ours": ours("bf16_tn_256", xp, y, n, k),
  "ours_x2": ours("bf16_tn_256_x2", xp, y, n, k),
  "torch_dgrad": lambda: torch._grouped_mm(dy, w, offs=offs, out_dtype=torch.bfloat16),
  "ours_dgrad": ours("bf16_nn_256", dyp, dx, k, n),
  "ours_x2_dgrad": ours("bf16_nn_256_x2", dyp, dx, k, n),
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
while time.time() - t0 < float(os.environ.get("SECONDS_ON", "3")):
    for _ in range(10): fn()
    iters += 10
    torch.cuda.synchronize()
end.record(); end.synchronize()
smi.terminate(); out = smi.communicate()[0].strip().splitlines()
vals = [[float(v) for v in l.split(",")] for l in out[5:] if l.count(",") == 2]
ms = start.elapsed_time(end) / iters
clk = sum(v[0] for v in vals) / len(vals); pw = sum(v[1] for v in vals) / len(vals); tmp = max(v[2] for v in vals)
print(f"{mode:14s} {sys.argv[2]:20s} {ms*1000:8.1f} us/iter {2*t*n*k/ms/1e9:7.1f} TF/s  sm clock {clk:6.0f} MHz  power {pw:5.0f} W  temp<= {tmp:.0f} C  samples {len(vals)}", flush=True)
