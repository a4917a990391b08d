#!/usr/bin/env bash
# MoE 1.9B (150 steps, timed over 26-150) and 235M (150 steps): the binary with the fused
# self-attention op (new) and the one before it (old: this session's earlier tree, scales by
# index and --no-checkpoint), bf16 and delayed scaling, alternating; the PyTorch peer at 1.9B.
source "$(dirname "$0")/common.sh"
T0=$(date +%s)
for r in bf16 delayed_scaling; do
  moe moe_train moe-1.9b $r 150 1.9b-$r-new
  moe moe_train_old moe-1.9b $r 150 1.9b-$r-old
done
moe moe_train moe-1.9b current_scaling 150 1.9b-current_scaling-new
t0=$(date +%s)
timeout 120 python3 ../benches/peer/moe_train_torch.py --config ../configs/moe-1.9b.json --data /tmp/corpus.txt --steps 150 --out $OUT/torch-1.9b.json > /tmp/torch.log 2>&1; echo "torch 1.9b rc=$? ($(( $(date +%s) - t0 )) s)"; tail -1 /tmp/torch.log | cut -c1-300
echo "to here $(( $(date +%s) - T0 )) s"
for r in bf16 delayed_scaling; do
  moe moe_train moe-235m $r 150 235m-$r-new
  moe moe_train_old moe-235m $r 150 235m-$r-old
done
echo "total $(( $(date +%s) - T0 )) s"
