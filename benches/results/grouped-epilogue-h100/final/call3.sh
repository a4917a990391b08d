#!/usr/bin/env bash
# Final tree: CUDA tests, then the GroupedLinear step against PyTorch once more.
cd "$(dirname "$0")"
rm -rf bin data && tar -xJf bundle.tar.xz
export LOWP_GOLDENS=$PWD/data/goldens LOWP_TEST_DATA=$PWD/data/tests-data LOWP_TEST_DEVICE=cuda
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
for t in bin/test-kernels* bin/test-modules*; do
  echo "=== $t"; "$t" --test-threads=1 > $OUT/$(basename $t).log 2>&1; echo "rc=$?"
  grep -E "^test result|FAILED|panicked" $OUT/$(basename $t).log | head -20
done
B=$(ls bin/bench-grouped* | head -1)
LOWP_BENCH_FILTER=grouped_linear_step $B --bench > $OUT/steps.jsonl 2> $OUT/steps.err; echo "steps rc=$?"
(cd ../benches && python3 grouped_torch.py --steps-only --ours $OUT/steps.jsonl > $OUT/steps-torch.jsonl 2>&1); echo "torch rc=$?"
python3 - $OUT/steps-torch.jsonl <<'PY'
import json,sys
for l in open(sys.argv[1]):
    if not l.startswith("{"): continue
    o=json.loads(l)
    if o.get("bench")=="compare": print(o["recipe"],o["dist"],o["ours_us"],o.get("torch_bf16_us"),o.get("speedup_over_torch_bf16"),o.get("split_reads_per_step"),o.get("blocking_syncs_per_step"))
    elif o.get("bench")=="torch_grouped_linear_step": print("torch",o["dist"],o["time_us"])
PY
