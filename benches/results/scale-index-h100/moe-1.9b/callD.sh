#!/usr/bin/env bash
# Call D: MoE 1.9B (hidden 4096, 4 layers), 60 steps timed after the first 10 (log_every 10),
# per recipe against the PyTorch peer, --no-checkpoint (a 1.9B checkpoint is ~22 GB: two of them
# filled the 64 GB disk and lost the machine in an earlier call); then a host profile of the 235M
# delayed-scaling step.
source "$(dirname "$0")/common.sh"
T0=$(date +%s)
python3 -c "
import json; c=json.load(open('../configs/moe-1.9b.json')); c['train']['log_every']=10
json.dump(c, open('/tmp/moe-1.9b-bench.json','w'))"
run19() { # recipe steps tag [extra]
  local r=$1 steps=$2 tag=$3; shift 3; local t0=$(date +%s)
  timeout 150 bin/moe_train --config /tmp/moe-1.9b-bench.json --recipe ../recipes/$r.json --data /tmp/corpus.txt --steps $steps --quiet --no-checkpoint --out /tmp/runs/$tag "$@" > /tmp/runs-$tag.log 2>&1 || { echo "$tag rc=$?"; tail -2 /tmp/runs-$tag.log | cut -c1-300; }
  summary /tmp/runs/$tag "$tag ($(( $(date +%s) - t0 )) s)"; cp /tmp/runs/$tag/*/summary.json $OUT/moe-$tag.json 2>/dev/null
}
for r in bf16 current_scaling delayed_scaling; do run19 $r 60 1.9b-$r; done
for r in bf16 delayed_scaling; do run19 $r 30 1.9b-$r-sync --sync-every-step; done
t0=$(date +%s)
timeout 150 python3 ../benches/peer/moe_train_torch.py --config /tmp/moe-1.9b-bench.json --data /tmp/corpus.txt --steps 60 --out $OUT/torch-1.9b.json > /tmp/torch-1.9b.log 2>&1; echo "torch 1.9b rc=$? ($(( $(date +%s) - t0 )) s)"; tail -1 /tmp/torch-1.9b.log | cut -c1-400
df -h /tmp | tail -1
echo "to here $(( $(date +%s) - T0 )) s"
timeout 120 bin/moe_train --config ../configs/moe-235m.json --recipe ../recipes/delayed_scaling.json --data /tmp/corpus.txt --steps 40 --quiet --no-checkpoint --out /tmp/runs/prof --host-profile /tmp/prof > /tmp/prof.log 2>&1; echo "profile rc=$?"
cp /tmp/prof/delayed_scaling/summary.txt $OUT/host-profile-235m-delayed.txt 2>/dev/null; head -70 /tmp/prof/delayed_scaling/summary.txt | cut -c1-200
echo "total $(( $(date +%s) - T0 )) s"
