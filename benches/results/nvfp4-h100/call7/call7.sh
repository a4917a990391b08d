#!/usr/bin/env bash
# NVFP4 call 7: the review commit (one group_of_row helper in the FP8 per-tensor, FP8 block and
# NVFP4 kernels): the CUDA quantize, grouped, delayed-scaling and special-value kernel tests.
cd "$(dirname "$0")"
rm -rf bin data && tar -xJf bundle.tar.xz
export LOWP_GOLDENS=$PWD/data/goldens LOWP_TEST_DATA=$PWD/data/tests-data LOWP_TEST_DEVICE=cuda
cd ..
T0=$(date +%s)
tk=$(ls .gpu/bin/test-kernels* | head -1)
timeout 540 $tk --test-threads=8 cuda::grouped cuda::quantize_matches_reference cuda::tile_quantize cuda::nvfp4_special cuda::padded cuda::delayed cuda::swizzled cuda::golden cuda::fp8_special > $OUT/test-kernels.log 2>&1; echo "kernels rc=$? ($(( $(date +%s) - T0 )) s)"
grep -hE "^test result|FAILED|panicked" $OUT/test-kernels.log | head -10
grep -c "\.\.\. ok" $OUT/test-kernels.log
