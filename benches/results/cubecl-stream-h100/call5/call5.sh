#!/usr/bin/env bash
# Call 5: MoE 235M on this tree, three recipes in rounds (three rounds, 200 steps each, one
# tuning file per recipe), and the eager PyTorch BF16 peer on the same config and data.
source "$(dirname "$0")/common.sh"
T0=$(date +%s)
for pass in 1 2 3; do
  for r in bf16 current_scaling delayed_scaling; do
    moe moe-235m $r 200 r200-$r-$pass --gemm-tuning /tmp/tune-$r.json
  done
done
(cd .. && timeout 200 python3 benches/peer/moe_train_torch.py --config configs/moe-235m.json --data /tmp/corpus.txt --steps 200 --out $OUT/torch-235m.json > /tmp/torch-235m.log 2>&1); echo "torch rc=$?"
tail -3 /tmp/torch-235m.log | cut -c1-300
echo "total $(( $(date +%s) - T0 )) s"
