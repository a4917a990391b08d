#!/usr/bin/env bash
# Call 7: the launch path trimmed in the vendored cubecl-cuda (one kernel lookup per launch, the
# dynamic shared memory attribute set at load). CUDA kernel and module suites; MoE 235M bf16 and
# current scaling, the previous tree ("old") and this one ("new") alternating, one tuning file
# per recipe; this tree's wall-clock profile of the current-scaling step.
source "$(dirname "$0")/common.sh"
T0=$(date +%s)
for n in modules kernels; do
  t=$(ls bin/test-$n* | head -1)
  timeout 240 $t --test-threads=1 > $OUT/test-$n.log 2>&1; echo "$n rc=$? ($(( $(date +%s) - T0 )) s)"
  grep -hE "^test result|FAILED|panicked" $OUT/test-$n.log | head -10
done
for pass in 1 2; do
  for r in bf16 current_scaling; do
    BIN=moe_train_old moe moe-235m $r 150 235m-$r-old-$pass --gemm-tuning /tmp/tune-$r.json
    moe moe-235m $r 150 235m-$r-new-$pass --gemm-tuning /tmp/tune-$r.json
  done
done
moe moe-235m current_scaling 80 prof-new --gemm-tuning /tmp/tune-current_scaling.json --host-profile /tmp/prof-new
cp /tmp/prof-new/*/summary.txt $OUT/host-profile-new.txt 2>/dev/null
grep "^## thread" $OUT/host-profile-new.txt
grep -E "Server::start$|ComputeServer>::launch$|Command::kernel$|execute_task$|hash_one$|contains_key$|cuFuncSetAttribute|submit_inner$" $OUT/host-profile-new.txt | head -12
echo "total $(( $(date +%s) - T0 )) s"
