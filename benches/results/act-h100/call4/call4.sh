#!/usr/bin/env bash
# Call 4 (the final kernels): the whole CUDA kernel and module test suites, with the new
# exact-rounding check of the activation stores.
cd "$(dirname "$0")"
rm -rf bin data && tar -xJf bundle.tar.xz
export LOWP_GOLDENS=$PWD/data/goldens LOWP_TEST_DATA=$PWD/data/tests-data LOWP_TEST_DEVICE=cuda
cd ..
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
T0=$(date +%s); el() { echo "$(( $(date +%s) - T0 )) s"; }
tk=$(ls .gpu/bin/test-kernels* | head -1); tm=$(ls .gpu/bin/test-modules* | head -1)
timeout 380 $tk --test-threads=4 cuda:: > $OUT/test-kernels.log 2>&1; echo "kernels rc=$? $(el)"
grep -hE "^test result|FAILED|panicked" $OUT/test-kernels.log | head -20
timeout 180 $tm --test-threads=4 cuda:: > $OUT/test-modules.log 2>&1; echo "modules rc=$? $(el)"
grep -hE "^test result|FAILED|panicked" $OUT/test-modules.log | head -20
echo "done $(el)"
