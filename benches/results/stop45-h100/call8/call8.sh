#!/usr/bin/env bash
# Call 8 (stop 45): issue 12's quantize figures on the final tree: benches/quantize.rs whole (every
# format, direction and encoder at 16384 x 8192 and 4096 x 4096) and its PyTorch peer (eager and
# torch.compile) right after.
cd "$(dirname "$0")"
rm -rf bin data && tar -xJf bundle.tar.xz
cd ..
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
T0=$(date +%s); el() { echo "$(( $(date +%s) - T0 )) s"; }
bq=$(ls .gpu/bin/bench-quantize* | head -1)
timeout 240 $bq --bench > $OUT/quantize.jsonl 2>/tmp/q.err; echo "quantize rc=$? $(el)"; tail -2 /tmp/q.err
timeout 330 python3 benches/quantize_torch.py > $OUT/quantize-torch.jsonl 2>/tmp/t.err; echo "torch rc=$? $(el)"; tail -2 /tmp/t.err
python3 - $OUT <<'PY'
import json, sys
ours, theirs, copy = {}, {}, {}
for l in open(f"{sys.argv[1]}/quantize.jsonl"):
    try: o = json.loads(l)
    except Exception: continue
    if o.get("bench") == "copy": copy[tuple(o["shape"])] = o["time_us"]
    if o.get("bench") == "quantize" and o.get("encoder") == "instruction" and o.get("kernel", "launcher") == "launcher":
        ours[(o["format"], o["usage"], tuple(o["shape"]))] = (o["time_us"], o["ratio_to_copy"])
for l in open(f"{sys.argv[1]}/quantize-torch.jsonl"):
    try: o = json.loads(l)
    except Exception: continue
    if o.get("mode") == "compile": theirs[(o["format"], o["usage"], tuple(o["shape"]))] = o["time_us"]
print("copy", copy)
for k in sorted(ours):
    t, r = ours[k]; c = theirs.get(k)
    print(f"{k[0]:22s} {k[1]:10s} {k[2]} ours {t:8.1f} us {r:.3f} of copy; torch.compile {c} -> {c / t if c else float('nan'):.2f}x")
PY
echo "done $(el)"
