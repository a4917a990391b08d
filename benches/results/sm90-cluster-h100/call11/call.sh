#!/bin/bash
# Stop 47, call 11 (final tree): CUDA tests (all; then the grouped module tests with our kernel as
# the graph-safe path), the probe's checks, the crate's selected kernels in turns with PyTorch,
# and the GroupedLinear bf16 step with cuBLASLt's bound batch against our kernel.
set -u
root=$PWD
cd .gpu && tar -xJf bundle.tar.xz && cd "$root"
( cd benches/sm90_probe && nvcc -O3 -std=c++17 -shared -Xcompiler -fPIC -gencode=arch=compute_90a,code=sm_90a \
    -o libprobe.so harness.cu -lcuda > $OUT/probe-build.txt 2>&1; echo "rc=$?" >> $OUT/probe-build.txt ) &
export LOWP_GOLDENS=$root/.gpu/data/goldens LOWP_TEST_DATA=$root/.gpu/data/tests-data
T0=$(date +%s); el() { echo "$(( $(date +%s) - T0 )) s"; }
timeout 220 tests/run_cuda_tests.sh -j 12 -o $OUT/tests .gpu/bin/test-kernels .gpu/bin/test-modules > $OUT/tests.txt 2>&1
echo "tests rc=$? $(el)"; tail -1 $OUT/tests.txt; grep -v "rc=0" $OUT/tests.txt | head -20
LOWP_TEST_DEVICE=cuda LOWP_GROUPED_KERNEL=sm90 timeout 120 .gpu/bin/test-modules cuda::grouped --test-threads=6 > $OUT/tests-grouped-sm90.txt 2>&1
echo "grouped tests with LOWP_GROUPED_KERNEL=sm90 rc=$? $(el)"; grep -E "test result|FAILED|panicked" $OUT/tests-grouped-sm90.txt | head
wait
tail -1 $OUT/probe-build.txt
cd benches/sm90_probe
timeout 60 python3 probe.py ./libprobe.so --check > $OUT/probe-check.txt 2>&1; echo "check rc=$? $(el)"; grep -c " ok" $OUT/probe-check.txt; grep FAIL $OUT/probe-check.txt | head
LOWP_ROUNDS=3 timeout 120 python3 probe.py ./libprobe.so --time --selected > $OUT/probe-time.txt 2>&1; echo "time rc=$? $(el)"
grep "^time" $OUT/probe-time.txt | sed 's/  */ /g' | cut -d' ' -f2,6- | sed 's/ours//; s/torch//'
cd "$root"
for kernel in cublaslt sm90; do
  LOWP_GROUPED_KERNEL=$kernel LOWP_BENCH_FILTER="grouped_linear_step bf16 " timeout 70 .gpu/bin/bench-grouped --bench > $OUT/step-bf16-$kernel.jsonl 2> $OUT/step-bf16-$kernel.err
  echo "step bf16 $kernel rc=$? $(el)"
done
cat $OUT/step-*.jsonl | python3 -c "
import json,sys
for l in sys.stdin:
    l=l.strip()
    if not l.startswith('{'): continue
    d=json.loads(l); print(d.get('case'), {k:v for k,v in d.items() if 'us' in k or 'batches' in k})
"
cd $OUT && tar -cJf tests.tar.xz tests && rm -rf tests
cd "$root/benches/sm90_probe"
LOWP_ROUNDS=2 timeout 60 python3 probe.py ./libprobe.so --time --bands 16 --only bf16_nn_256 bf16_nn_128_pingpong e4m3_tn_256 e4m3_tn_128_pingpong --shapes 16,32768,2048,768 > $OUT/probe-coop-vs-pingpong.txt 2>&1; echo "coop vs pingpong rc=$? $(el)"
grep "^time" $OUT/probe-coop-vs-pingpong.txt | sed 's/  */ /g' | cut -d' ' -f2,6- | sed 's/ours//; s/torch//'
