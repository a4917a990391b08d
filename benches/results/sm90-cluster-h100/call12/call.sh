#!/bin/bash
# Stop 47, call 12: the grouped module tests of the final tree (BF16 cooperative at every length),
# default and with our kernel as the graph-safe path; GroupedLinear steps (bf16, FP8 current
# scaling) with cuBLASLt's bound batch against our kernel, twice each in alternation.
set -u
root=$PWD
cd .gpu && tar -xJf bundle.tar.xz && unxz -f extra/test-modules.xz && chmod +x extra/test-modules && cd "$root"
export LOWP_GOLDENS=$root/.gpu/data/goldens LOWP_TEST_DATA=$root/.gpu/data/tests-data LOWP_TEST_DEVICE=cuda
T0=$(date +%s); el() { echo "$(( $(date +%s) - T0 )) s"; }
for kernel in cublaslt sm90; do
  LOWP_GROUPED_KERNEL=$kernel timeout 100 .gpu/extra/test-modules cuda::grouped --test-threads=6 > $OUT/tests-grouped-$kernel.txt 2>&1
  echo "grouped tests LOWP_GROUPED_KERNEL=$kernel rc=$? $(el)"; grep -E "test result|FAILED|panicked" $OUT/tests-grouped-$kernel.txt | head -5
done
for r in 1 2; do for kernel in cublaslt sm90; do for recipe in bf16 current_scaling; do
  LOWP_GROUPED_KERNEL=$kernel LOWP_BENCH_FILTER="grouped_linear_step $recipe " timeout 60 .gpu/bin/bench-grouped --bench 2>/dev/null | grep '^{' | sed "s/^/$kernel $r /" >> $OUT/steps.txt
done; done; done
echo "steps $(el)"
python3 - $OUT/steps.txt <<'PY'
import json, sys
for l in open(sys.argv[1]):
    k, r, j = l.split(" ", 2); d = json.loads(j)
    print(k, r, d.get("recipe"), d.get("distribution", d.get("dist")), d.get("time_us"), "device_grouped", d.get("device_grouped_batches_per_step"), "bound", d.get("bound_batches_per_step"))
PY
