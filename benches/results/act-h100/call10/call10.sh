#!/usr/bin/env bash
# Call 10: the whole CUDA kernel test suite on the shipped kernels (call 9's bundle), eight test
# threads so that NVRTC's compiles overlap (call 4 ran four and did not finish in 380 s).
cd "$(dirname "$0")"
rm -rf bin data && tar -xJf bundle.tar.xz
export LOWP_GOLDENS=$PWD/data/goldens LOWP_TEST_DATA=$PWD/data/tests-data LOWP_TEST_DEVICE=cuda
cd ..
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
T0=$(date +%s); el() { echo "$(( $(date +%s) - T0 )) s"; }
tk=$(ls .gpu/bin/test-kernels* | head -1)
timeout 540 $tk --test-threads=8 cuda:: > $OUT/test-kernels.log 2>&1; echo "kernels rc=$? $(el)"
grep -hE "^test result|FAILED|panicked" $OUT/test-kernels.log | head -20
grep -cE "^test .* ok$" $OUT/test-kernels.log
echo "done $(el)"
