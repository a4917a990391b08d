#!/usr/bin/env bash
# CUDA tests of the final tree.
cd "$(dirname "$0")"
rm -rf bin data && tar -xJf bundle.tar.xz
export LOWP_GOLDENS=$PWD/data/goldens LOWP_TEST_DATA=$PWD/data/tests-data LOWP_TEST_DEVICE=cuda
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
for t in bin/test-kernels* bin/test-modules*; do
  n=$(basename $t | cut -d- -f1-2)
  echo "=== $n"; timeout 280 "$t" --test-threads=1 > $OUT/$n.log 2>&1; echo "rc=$?"
  grep -hE "^test result|FAILED|panicked" $OUT/$n.log | head -20
done
