#!/bin/bash
# Stop 48, call 9: every CUDA test with our kernel as the graph-safe path
# (LOWP_GROUPED_KERNEL=sm90: what the default becomes), on call 8's build.
set -u
root=$PWD
cd .gpu && tar -xJf bundle.tar.xz && cd "$root"
export LOWP_GOLDENS=$root/.gpu/data/goldens LOWP_TEST_DATA=$root/.gpu/data/tests-data LOWP_GROUPED_KERNEL=sm90
mkdir -p $OUT/logs
timeout 230 tests/run_cuda_tests.sh -j 12 -o $OUT/logs/tests .gpu/bin/test-kernels .gpu/bin/test-modules > $OUT/logs/tests.txt 2>&1
echo "tests with LOWP_GROUPED_KERNEL=sm90 rc=$?"; tail -1 $OUT/logs/tests.txt; grep -v "rc=0" $OUT/logs/tests.txt | head -20
cd $OUT && tar -cJf logs.tar.xz logs && rm -rf logs
