#!/usr/bin/env bash
# Call A: CUDA tests; GroupedLinear step per recipe against PyTorch; MoE 235M, one pass, the
# binary before the change (old) beside the new one.
source "$(dirname "$0")/common.sh"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
T0=$(date +%s)
for t in bin/test-kernels* bin/test-modules*; do
  echo "=== $t"; "$t" --test-threads=1 > $OUT/$(basename $t | cut -d- -f1-2).log 2>&1; echo "rc=$?"
  grep -hE "^test result|FAILED|panicked" $OUT/$(basename $t | cut -d- -f1-2).log | head -20
done
echo "tests took $(( $(date +%s) - T0 )) s"
B=$(ls bin/bench-grouped* | head -1)
LOWP_BENCH_FILTER=grouped_linear_step $B --bench > $OUT/steps.jsonl 2> /tmp/steps.err; echo "steps rc=$?"
(cd ../benches && python3 grouped_torch.py --steps-only --ours $OUT/steps.jsonl > $OUT/steps-torch.jsonl 2>&1); echo "torch rc=$?"
python3 - $OUT/steps-torch.jsonl <<'PY'
import json,sys
for l in open(sys.argv[1]):
    if not l.startswith("{"): continue
    o=json.loads(l)
    if o.get("bench")=="compare" and ("delayed" in o["recipe"] or o["recipe"] in ("bf16","current_scaling","current_scaling_shared")): print(o["recipe"],o["dist"],o.get("ours_us",""),o.get("torch_bf16_us"),o.get("speedup_over_torch_bf16"),o.get("split_reads_per_step"),o.get("blocking_syncs_per_step"))
    elif o.get("bench")=="torch_grouped_linear_step": print("torch",o["dist"],o["time_us"])
PY
echo "to here $(( $(date +%s) - T0 )) s"
for r in bf16 current_scaling delayed_scaling; do moe moe_train moe-235m $r 150 235m-$r-1; done
moe moe_train_old moe-235m delayed_scaling 150 235m-delayed_scaling-old-1
echo "total $(( $(date +%s) - T0 )) s"
