#!/bin/bash
# Stop 47, call 6 (final tree): CUDA tests (all), the probe's checks and the crate's selected
# kernels with their cluster twins in turns with PyTorch, on issue 9's three shapes.
set -u
root=$PWD
cd .gpu && tar -xJf bundle.tar.xz && cd "$root"
( cd benches/sm90_probe && nvcc -O3 -std=c++17 -shared -Xcompiler -fPIC -gencode=arch=compute_90a,code=sm_90a \
    -o libprobe.so harness.cu -lcuda > $OUT/probe-build.txt 2>&1; echo "rc=$?" >> $OUT/probe-build.txt ) &
export LOWP_GOLDENS=$root/.gpu/data/goldens LOWP_TEST_DATA=$root/.gpu/data/tests-data
T0=$(date +%s); el() { echo "$(( $(date +%s) - T0 )) s"; }
timeout 330 tests/run_cuda_tests.sh -j 12 -o $OUT/tests .gpu/bin/test-kernels .gpu/bin/test-modules > $OUT/tests.txt 2>&1
echo "tests rc=$? $(el)"; tail -3 $OUT/tests.txt; grep -v "rc=0" $OUT/tests.txt | head -20
grep -h "sm90" $OUT/tests/* 2>/dev/null | head -5
wait
tail -1 $OUT/probe-build.txt
cd benches/sm90_probe
timeout 90 python3 probe.py ./libprobe.so --check > $OUT/probe-check.txt 2>&1; echo "check rc=$? $(el)"; grep -c " ok" $OUT/probe-check.txt; grep FAIL $OUT/probe-check.txt | head
LOWP_ROUNDS=3 timeout 200 python3 probe.py ./libprobe.so --time --selected --x2 > $OUT/probe-time.txt 2>&1; echo "time rc=$? $(el)"
grep "^time" $OUT/probe-time.txt | sed 's/  */ /g' | cut -d' ' -f2,6- | sed 's/ours//; s/torch//'
cd $OUT && tar -cJf tests.tar.xz tests && rm -rf tests
