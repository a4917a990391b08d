#!/usr/bin/env bash
# The fixed tree (records split by bytes_slice): CUDA kernel and module suites in full, then MoE
# 235M current scaling with configs/debug/moe.json, the session's start (old) and this tree
# (new) alternating, the cost measured inside each run, and a plain run.
rm -rf "$(dirname "$0")/bin"
source "$(dirname "$0")/common.sh"
cd ..
export LOWP_GOLDENS=$PWD/.gpu/data/goldens LOWP_TEST_DATA=$PWD/.gpu/data/tests-data LOWP_TEST_DEVICE=cuda
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
T0=$(date +%s)
for t in .gpu/bin/test-kernels* .gpu/bin/test-modules*; do
  n=$(basename $t | cut -d- -f1-2)
  echo "=== $n"; timeout 280 "$t" --test-threads=1 > $OUT/$n.log 2>&1; echo "rc=$?"
  grep -hE "^test result|FAILED|panicked" $OUT/$n.log | head -20
done
echo "tests took $(( $(date +%s) - T0 )) s"
cd .gpu
D="--debug-config ../configs/debug/moe.json"
for pass in 1 2; do
  moe moe_train_old moe-235m current_scaling 150 235m-old-$pass $D
  moe moe_train moe-235m current_scaling 150 235m-new-$pass $D
done
moe moe_train moe-235m current_scaling 150 235m-plain
grep -h "debug cost" /tmp/runs-*.log | cut -c1-250
echo "total $(( $(date +%s) - T0 )) s"
