#!/usr/bin/env bash
# Call 4: CubeCL's sliced memory pool with the patched reservation (vendor/cubecl-runtime).
# CUDA module and kernel suites; MoE 235M (bf16, current and delayed scaling) and 1.9B, the
# binary before the patch ("old": GEMMs on CubeCL's stream already) and this tree ("new")
# alternating, one tuning file per model and recipe; a wall-clock host profile of the new
# binary's current-scaling step.
source "$(dirname "$0")/common.sh"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
T0=$(date +%s)
for n in modules kernels; do
  t=$(ls bin/test-$n* | head -1)
  timeout 240 $t --test-threads=1 > $OUT/test-$n.log 2>&1; echo "$n rc=$? ($(( $(date +%s) - T0 )) s)"
  grep -hE "^test result|FAILED|panicked" $OUT/test-$n.log | head -10
done
for r in bf16 current_scaling delayed_scaling; do
  for pass in 1 2; do
    BIN=moe_train_old moe moe-235m $r 100 235m-$r-old-$pass --gemm-tuning /tmp/tune-$r.json
    moe moe-235m $r 100 235m-$r-new-$pass --gemm-tuning /tmp/tune-$r.json
  done
done
moe moe-235m current_scaling 60 prof-new --gemm-tuning /tmp/tune-current_scaling.json --host-profile /tmp/prof-new
cp /tmp/prof-new/*/summary.txt $OUT/host-profile-new.txt 2>/dev/null
grep -A12 "^## thread DSD" $OUT/host-profile-new.txt | head -14 | cut -c1-150
for r in bf16 delayed_scaling; do
  BIN=moe_train_old moe moe-1.9b $r 60 1.9b-$r-old --gemm-tuning /tmp/tune-1.9b-$r.json
  moe moe-1.9b $r 60 1.9b-$r-new --gemm-tuning /tmp/tune-1.9b-$r.json
done
echo "total $(( $(date +%s) - T0 )) s"
