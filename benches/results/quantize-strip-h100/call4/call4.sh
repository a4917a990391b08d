#!/usr/bin/env bash
# Quantize call 4 (final tree, grouped rows in the transposed FP8 block kernel): CUDA kernel and
# module suites.
cd "$(dirname "$0")"
rm -rf bin data && tar -xJf bundle.tar.xz
export LOWP_GOLDENS=$PWD/data/goldens LOWP_TEST_DATA=$PWD/data/tests-data LOWP_TEST_DEVICE=cuda
cd ..
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
T0=$(date +%s)
tk=$(ls .gpu/bin/test-kernels* | head -1); tm=$(ls .gpu/bin/test-modules* | head -1)
timeout 280 $tk --test-threads=1 > $OUT/test-kernels.log 2>&1; echo "kernels rc=$? ($(( $(date +%s) - T0 )) s)"
grep -hE "^test result|FAILED|panicked" $OUT/test-kernels.log | head -10
grep -h "grouped" $OUT/test-kernels.log | head -8
T1=$(date +%s)
timeout 150 $tm --test-threads=1 > $OUT/test-modules.log 2>&1; echo "modules rc=$? ($(( $(date +%s) - T1 )) s)"
grep -hE "^test result|FAILED|panicked" $OUT/test-modules.log | head -10
echo "total $(( $(date +%s) - T0 )) s"
