#!/usr/bin/env bash
# CUDA tests of the tree with the fused self-attention op.
source "$(dirname "$0")/common.sh"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
T0=$(date +%s)
for t in bin/test-kernels* bin/test-modules*; do
  n=$(basename $t | cut -d- -f1-2)
  echo "=== $n"; "$t" --test-threads=1 > $OUT/$n.log 2>&1; echo "rc=$?"
  grep -hE "^test result|FAILED|panicked" $OUT/$n.log | head -20
done
grep -hE "self_attention|head_split|delayed_scaling_matches|record_into" $OUT/*.log | head
echo "tests took $(( $(date +%s) - T0 )) s"
