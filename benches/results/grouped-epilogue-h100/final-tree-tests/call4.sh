#!/usr/bin/env bash
# The final tree (after the review's refactors): CUDA kernel and module tests.
cd "$(dirname "$0")"
rm -rf bin data && tar -xJf bundle.tar.xz
export LOWP_GOLDENS=$PWD/data/goldens LOWP_TEST_DATA=$PWD/data/tests-data LOWP_TEST_DEVICE=cuda
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
for t in bin/test-kernels* bin/test-modules*; do
  echo "=== $t"; "$t" --test-threads=1 > $OUT/$(basename $t).log 2>&1; echo "rc=$?"
  grep -E "^test result|FAILED|panicked" $OUT/$(basename $t).log | head -20
done
