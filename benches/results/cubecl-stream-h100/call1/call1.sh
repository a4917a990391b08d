#!/usr/bin/env bash
# Call 1: GEMMs on CubeCL's own stream (StreamOrdering::CubeclStream, vendored cubecl-cuda) against
# the device-flag handshake. CUDA module suite; GEMM bench (three orderings) and PyTorch peer;
# MoE 235M bf16 and current scaling, the two orderings alternating with one tuning file per
# recipe; a wall-clock host profile of each ordering's current-scaling step.
source "$(dirname "$0")/common.sh"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
T0=$(date +%s)
t=$(ls bin/test-modules* | head -1)
timeout 170 $t --test-threads=1 > $OUT/test-modules.log 2>&1; echo "modules rc=$?"
grep -hE "^test result|FAILED|panicked" $OUT/test-modules.log | head -20
echo "tests took $(( $(date +%s) - T0 )) s"
t1=$(date +%s)
b=$(ls bin/bench-gemm* | head -1)
(cd .. && timeout 200 .gpu/$b --bench > $OUT/gemm.jsonl 2> /tmp/gemm.err); echo "gemm bench rc=$? ($(( $(date +%s) - t1 )) s)"; tail -2 /tmp/gemm.err | cut -c1-200
t1=$(date +%s)
(cd ../benches && timeout 150 python3 gemm_torch.py --ours $OUT/gemm.jsonl > $OUT/gemm-torch.jsonl 2>/tmp/torch.err); echo "torch rc=$? ($(( $(date +%s) - t1 )) s)"; tail -2 /tmp/torch.err | cut -c1-200
grep -h '"compare"' $OUT/gemm-torch.jsonl | cut -c1-220
grep -h '"handshake"' $OUT/gemm.jsonl
for r in bf16 current_scaling; do
  for pass in 1 2; do
    LOWP_STREAM_ORDERING=device-flags moe moe-235m $r 100 $r-flags-$pass --gemm-tuning /tmp/tune-$r.json
    moe moe-235m $r 100 $r-stream-$pass --gemm-tuning /tmp/tune-$r.json
  done
done
for o in device-flags cubecl-stream; do
  LOWP_STREAM_ORDERING=$o moe moe-235m current_scaling 60 prof-$o --gemm-tuning /tmp/tune-current_scaling.json --host-profile /tmp/prof-$o
  cp /tmp/prof-$o/*/summary.txt $OUT/host-profile-$o.txt 2>/dev/null
done
head -60 $OUT/host-profile-cubecl-stream.txt | cut -c1-160
echo "total $(( $(date +%s) - T0 )) s"
