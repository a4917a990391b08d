#!/usr/bin/env bash
# MoE 1.9B current scaling with GEMM autotuning off (LOWP_GEMM_AUTOTUNE=0: the heuristic's
# first algorithm, no timing): the debugged runs of call 6 timed 77-96 GEMM shapes the plain
# run never met (tuning file 20 -> 97-116 choices), so their sampling steps also paid that
# timing. Plain, the session's start (old) and this tree (new) with configs/debug/moe.json.
rm -rf "$(dirname "$0")/bin"
source "$(dirname "$0")/common.sh"
export LOWP_GEMM_AUTOTUNE=0
T0=$(date +%s)
D="--debug-config ../configs/debug/moe.json"
moe moe_train moe-1.9b current_scaling 100 1.9b-plain
moe moe_train_old moe-1.9b current_scaling 100 1.9b-old $D
moe moe_train moe-1.9b current_scaling 100 1.9b-new-1 $D
moe moe_train moe-1.9b current_scaling 100 1.9b-plain-2
moe moe_train moe-1.9b current_scaling 100 1.9b-new-2 $D
grep -h "debug cost" /tmp/runs-*.log | cut -c1-250
echo "total $(( $(date +%s) - T0 )) s"
