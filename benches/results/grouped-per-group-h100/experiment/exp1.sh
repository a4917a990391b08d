#!/usr/bin/env bash
# Experiment: pointer array vs per-group GEMMs for large known groups, and heuristic candidate count.
cd "$(dirname "$0")"
rm -rf bin data && tar -xJf bundle.tar.xz
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
B=bin/bench-grouped
run() { # label filter env...
  local label=$1 filter=$2; shift 2
  env "$@" LOWP_BENCH_FILTER="$filter" $B --bench 2>&1 | grep '^{' | sed "s/^{/{\"variant\":\"$label\",/" | tee -a $OUT/ours.jsonl | python3 -c '
import sys,json
for l in sys.stdin:
    o=json.loads(l)
    print(o["variant"],o["format"],o["gemm"],o["experts"],o["dist"],o.get("batch"),o.get("accumulation"),o["path"][:30],o.get("tflops"),o.get("error",""))'
}
for f in "grouped_gemm bf16 8x" "grouped_gemm fp8_tensor_shared 8x" "grouped_gemm fp8_tensor 8x" "grouped_gemm bf16 16x" "grouped_gemm fp8_tensor_shared 16x"; do
  run base "$f" X=1
  run cand32 "$f" LOWP_GEMM_CANDIDATES=32
  run pg1024 "$f" LOWP_GROUPED_PER_GROUP_ROWS=1024
done
run base "grouped_gemm fp8_tensor_shared 128x" X=1
run cand32 "grouped_gemm fp8_tensor_shared 128x" LOWP_GEMM_CANDIDATES=32
run base "grouped_gemm bf16 8x" X=1
cd ../benches && python3 grouped_torch.py 2>&1 | grep torch_grouped_gemm | tee $OUT/torch.jsonl | python3 -c '
import sys,json
for l in sys.stdin:
    o=json.loads(l)
    if o["experts"] in (8,16,128): print("torch",o["format"],o["gemm"],o["experts"],o["dist"],o.get("tflops"),o.get("error","")[:40])'
