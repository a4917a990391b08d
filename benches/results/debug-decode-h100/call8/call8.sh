#!/usr/bin/env bash
# The final tree (one fp8_grouped_element for the grouped dequantize kernel and the decoding
# statistics pass): the CUDA kernel suite in full.
cd "$(dirname "$0")/.."
rm -rf .gpu/bin .gpu/data && (cd .gpu && tar -xJf bundle.tar.xz)
export LOWP_GOLDENS=$PWD/.gpu/data/goldens LOWP_TEST_DATA=$PWD/.gpu/data/tests-data LOWP_TEST_DEVICE=cuda
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
T0=$(date +%s)
t=$(ls .gpu/bin/test-kernels*)
timeout 400 "$t" --test-threads=1 > $OUT/test-kernels.log 2>&1; echo "rc=$?"
grep -hE "^test result|FAILED|panicked" $OUT/test-kernels.log | head -20
grep -hE "plane_trees|decoded_quantization|grouped_stats|dequantiz" $OUT/test-kernels.log | head
echo "took $(( $(date +%s) - T0 )) s"
