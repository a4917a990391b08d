#!/bin/bash
# Stop 48, call 8 (final tree, with the E5M2 x E4M3 kernels): the probe's checks, every CUDA test,
# the grouped module tests with our kernel as the graph-safe path (now the hybrid dgrad too), and
# the GroupedLinear steps (bf16 and FP8 current scaling, whose hybrid dgrad now runs our kernel
# under sm90; cuBLASLt's bound batch against ours, two rounds in alternation).
set -u
root=$PWD
cd .gpu && tar -xJf bundle.tar.xz && cd "$root"
T0=$(date +%s); el() { echo "$(( $(date +%s) - T0 )) s"; }
( cd benches/sm90_probe && nvcc -O3 -std=c++17 -shared -Xcompiler -fPIC -gencode=arch=compute_90a,code=sm_90a \
    -o libprobe.so harness.cu -lcuda > $OUT/probe-build.txt 2>&1; echo "rc=$?" >> $OUT/probe-build.txt
  timeout 80 python3 probe.py ./libprobe.so --check > $OUT/probe-check.txt 2>&1; echo "check rc=$?" >> $OUT/probe-build.txt ) &
export LOWP_GOLDENS=$root/.gpu/data/goldens LOWP_TEST_DATA=$root/.gpu/data/tests-data
mkdir -p $OUT/logs
timeout 220 tests/run_cuda_tests.sh -j 12 -o $OUT/logs/tests .gpu/bin/test-kernels .gpu/bin/test-modules > $OUT/logs/tests.txt 2>&1
echo "tests rc=$? $(el)"; tail -1 $OUT/logs/tests.txt; grep -v "rc=0" $OUT/logs/tests.txt | head -20
LOWP_TEST_DEVICE=cuda LOWP_GROUPED_KERNEL=sm90 timeout 100 .gpu/bin/test-modules cuda::grouped --test-threads=6 > $OUT/logs/tests-grouped-sm90.txt 2>&1
echo "grouped tests with LOWP_GROUPED_KERNEL=sm90 rc=$? $(el)"; grep -E "test result|FAILED|panicked" $OUT/logs/tests-grouped-sm90.txt | head
wait; cat $OUT/probe-build.txt | tail -2; grep -c " ok" $OUT/probe-check.txt; grep -E "FAIL" $OUT/probe-check.txt | head; grep "e5m2" $OUT/probe-check.txt | head -3
for r in 1 2; do for kernel in cublaslt sm90; do for recipe in bf16 current_scaling; do
  LOWP_GROUPED_KERNEL=$kernel LOWP_BENCH_FILTER="grouped_linear_step $recipe " timeout 45 .gpu/bin/bench-grouped --bench 2>/dev/null | grep '^{' | sed "s/^/$kernel $r /" >> $OUT/steps.txt
done; done; done
echo "steps $(el)"
python3 - $OUT/steps.txt <<'PY'
import json, sys
for l in open(sys.argv[1]):
    k, r, j = l.split(" ", 2); d = json.loads(j)
    print(k, r, d.get("recipe"), d.get("dist"), d.get("time_us"), "device_grouped", d.get("device_grouped_batches_per_step"), "bound", d.get("bound_batches_per_step"), "exact", d.get("exact_batches_per_step"), "blocking", d.get("blocking_syncs_per_step"))
PY
cd $OUT && tar -cJf logs.tar.xz logs && rm -rf logs
echo "done $(el)"
