#!/usr/bin/env bash
# Call B: MoE 235M second pass and the host phases (--sync-every-step); then MoE 1.9B (hidden
# 4096, 4 layers) per recipe against the PyTorch peer, each run under a time limit.
source "$(dirname "$0")/common.sh"
T0=$(date +%s)
for r in delayed_scaling bf16 current_scaling; do moe moe_train moe-235m $r 150 235m-$r-2; done
moe moe_train_old moe-235m delayed_scaling 150 235m-delayed_scaling-old-2
moe moe_train moe-235m delayed_scaling 60 235m-delayed-sync --sync-every-step
moe moe_train_old moe-235m delayed_scaling 60 235m-delayed-old-sync --sync-every-step
echo "to here $(( $(date +%s) - T0 )) s"
free -g | head -2
