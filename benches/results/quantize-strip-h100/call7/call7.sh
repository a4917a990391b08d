#!/usr/bin/env bash
# Call 7: the review commit (shared tile-group and scale-index helpers in the FP8 block kernels):
# the CUDA quantize, grouped and golden kernel tests.
cd "$(dirname "$0")"
rm -rf bin data && tar -xJf bundle.tar.xz
export LOWP_GOLDENS=$PWD/data/goldens LOWP_TEST_DATA=$PWD/data/tests-data LOWP_TEST_DEVICE=cuda
cd ..
T0=$(date +%s)
tk=$(ls .gpu/bin/test-kernels* | head -1)
timeout 250 $tk --test-threads=1 cuda::grouped cuda::quantize_matches_reference cuda::tile_quantize cuda::padded cuda::swizzled cuda::golden cuda::fp8_special > $OUT/test-kernels.log 2>&1; echo "kernels rc=$? ($(( $(date +%s) - T0 )) s)"
grep -hE "^test |^test result|panicked" $OUT/test-kernels.log | head -12
