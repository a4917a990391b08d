#!/usr/bin/env bash
# Call 11 (stop 45): the BF16 4096^3 GEMM (0.942 then 1.000 of PyTorch in call 9's two turns runs)
# and the FP8 per-tensor 8192^3 GEMM, in turns with PyTorch, six runs each; kernel names of both
# sides from the CUPTI tracer.
cd "$(dirname "$0")"
rm -rf bin data && tar -xJf bundle.tar.xz
cd ..
T0=$(date +%s); el() { echo "$(( $(date +%s) - T0 )) s"; }
bg=$(ls .gpu/bin/bench-gemm* | head -1)
for c in "gemm bf16 4096x4096x4096" "gemm fp8_tensor 8192x8192x8192"; do
  for r in 1 2 3 4 5 6; do
    LOWP_BENCH_FILTER="$c" timeout 60 python3 benches/gemm_torch.py --turns $bg 2>/dev/null | grep '"compare"' | grep cubecl_stream | sed "s/^{/{\"run\":$r,/" >> $OUT/turns.jsonl
  done
  echo "$c $(el)"
done
python3 - $OUT <<'PY'
import json, sys, collections
t = collections.defaultdict(list)
for l in open(f"{sys.argv[1]}/turns.jsonl"):
    o = json.loads(l); t[(o["format"], o["m"])].append((o["ours"], o["torch"], o["ratio"]))
for k, v in t.items():
    rs = sorted(r for _, _, r in v)
    print(k, "ratios", rs, "median", rs[len(rs) // 2], "ours", [a for a, _, _ in v], "torch", [b for _, b, _ in v])
PY
CI=$(dirname $(find / -name cupti.h -not -path '*/proc/*' 2>/dev/null | head -1)); L=$(find / -name 'libcupti.so*' -not -path '*/proc/*' 2>/dev/null | head -1); CL=$(dirname $L)
CUDAINC=$(dirname $(find / -name cuda.h -path '*include*' -not -path '*/proc/*' 2>/dev/null | head -1))
gcc -O2 -shared -fPIC benches/profile/cupti_trace.c -I$CI -I$CUDAINC -L$CL -l:$(basename $L) -Wl,-rpath,$CL -o /tmp/libcupti_trace.so || echo "no tracer"
LOWP_BENCH_FILTER="gemm bf16 4096x4096x4096" timeout 60 env CUDA_INJECTION64_PATH=/tmp/libcupti_trace.so LOWP_CUPTI_TRACE=/tmp/ours.csv $bg --bench > /dev/null 2>&1
timeout 60 env CUDA_INJECTION64_PATH=/tmp/libcupti_trace.so LOWP_CUPTI_TRACE=/tmp/torch.csv python3 -c "
import torch
x = torch.randn(4096, 4096, device='cuda', dtype=torch.bfloat16); w = torch.randn(4096, 4096, device='cuda', dtype=torch.bfloat16)
for _ in range(50): torch.mm(x, w.t())
torch.cuda.synchronize()" > /dev/null 2>&1
for f in ours torch; do echo "== $f"; python3 - /tmp/$f.csv <<'PY'
import csv, sys, collections
n = collections.Counter(); d = collections.defaultdict(float)
for row in csv.DictReader(open(sys.argv[1])):
    if row["kind"] != "kernel":
        continue
    name = row["name"]
    n[name] += 1
    d[name] += int(row["end_ns"]) - int(row["start_ns"])
for k, c in n.most_common(4): print(c, k[:110], "mean us", round(d[k] / c / 1e3, 1), "grid", row["detail"] if False else "")
PY
done
echo "done $(el)"
