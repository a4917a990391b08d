#!/usr/bin/env bash
# Call E: MoE 1.9B (configs/moe-1.9b.json), 300 steps per recipe (timed after the first 25),
# --no-checkpoint, against the PyTorch peer's 300 steps: speed and the loss after 300 steps.
source "$(dirname "$0")/common.sh"
T0=$(date +%s)
for r in bf16 current_scaling delayed_scaling; do
  t0=$(date +%s)
  timeout 150 bin/moe_train --config ../configs/moe-1.9b.json --recipe ../recipes/$r.json --data /tmp/corpus.txt --steps 300 --quiet --no-checkpoint --out /tmp/runs300/$r > /tmp/runs300-$r.log 2>&1 || { echo "$r rc=$?"; tail -2 /tmp/runs300-$r.log | cut -c1-300; }
  summary /tmp/runs300/$r "1.9b-300-$r ($(( $(date +%s) - t0 )) s)"; cp /tmp/runs300/$r/*/summary.json $OUT/moe-1.9b-300-$r.json 2>/dev/null
done
t0=$(date +%s)
timeout 200 python3 ../benches/peer/moe_train_torch.py --config ../configs/moe-1.9b.json --data /tmp/corpus.txt --steps 300 --out $OUT/torch-1.9b-300.json > /tmp/torch-1.9b.log 2>&1; echo "torch 1.9b rc=$? ($(( $(date +%s) - t0 )) s)"; tail -1 /tmp/torch-1.9b.log | cut -c1-300
echo "total $(( $(date +%s) - T0 )) s"
