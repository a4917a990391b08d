#!/usr/bin/env bash
# Same machine as call3: MoE 1.9B current scaling with configs/debug/moe.json, old and new, a
# plain run; MoE 235M with the statistics alone, AutoswitchGemm alone, and AutoswitchGemm at a
# 0.5 % underflow threshold (to show switches in a healthy run); this tree.
source "$(dirname "$0")/common.sh"
T0=$(date +%s)
D="--debug-config ../configs/debug/moe.json"
moe moe_train_old moe-1.9b current_scaling 100 1.9b-old $D
moe moe_train moe-1.9b current_scaling 100 1.9b-new $D
moe moe_train moe-1.9b current_scaling 100 1.9b-plain
moe moe_train moe-235m current_scaling 150 235m-stats --debug-config ../benches/results/debug-decode-h100/stats-only.json
moe moe_train moe-235m current_scaling 150 235m-autoswitch --debug-config ../benches/results/debug-decode-h100/autoswitch-only.json
ROWS=40 moe moe_train moe-235m current_scaling 150 235m-low-threshold --debug-config ../benches/results/debug-decode-h100/low-threshold.json
# GPU time of the statistics kernels (Nsight Compute, kernels serialized) over the first 12 steps
# of a debugged run: every launch whose name holds "stats" (iterations 0 and 10 sample).
NCU=$(which ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
t0=$(date +%s)
LOWP_STREAM_ORDERING=host-sync timeout 150 $NCU --clock-control none --kernel-name regex:stats --launch-count 1000 --csv --print-units base \
  --metrics gpu__time_duration.sum,launch__grid_size,launch__block_size \
  bin/moe_train --config ../configs/moe-235m.json --recipe ../recipes/current_scaling.json --data /tmp/corpus.txt --steps 12 --quiet --no-checkpoint $D --out /tmp/ncu-runs/dbg > /tmp/ncu-dbg.csv 2>/tmp/ncu-dbg.err
echo "ncu rc=$? ($(( $(date +%s) - t0 )) s)"; tail -2 /tmp/ncu-dbg.err | cut -c1-200
python3 ../benches/profile/kernels_by_name.py /tmp/ncu-dbg.csv 10 > $OUT/ncu-stats.txt 2>&1; cut -c1-200 $OUT/ncu-stats.txt
grep -h "debug cost" /tmp/runs-*.log | cut -c1-250
echo "total $(( $(date +%s) - T0 )) s"
