#!/usr/bin/env bash
# MoE 1.9B current scaling, GEMM autotuning off, with LOWP_SPLIT_COPY=read-only (the splits'
# host copy taken only by its first reader, never by the arrival probe, so no GEMM's path
# depends on GPU timing) and with the default probe: plain and debugged runs of the final tree.
# Do debugged runs repeat the plain run's losses once the path no longer depends on timing?
cd "$(dirname "$0")"
mkdir -p bin && xz -dc moe_train.xz > bin/moe_train && chmod +x bin/moe_train
[ -s /tmp/corpus.txt ] || find / -name "*.py" -path "*python3*" 2>/dev/null | head -3000 | xargs cat 2>/dev/null | head -c 15000000 > /tmp/corpus.txt
export LOWP_GEMM_AUTOTUNE=0
T0=$(date +%s)
run() { # run TAG [args]
  local tag=$1; shift
  timeout 120 bin/moe_train --config ../configs/moe-1.9b.json --recipe ../recipes/current_scaling.json --data /tmp/corpus.txt --steps 100 --quiet --no-checkpoint --out /tmp/runs/$tag "$@" > /tmp/runs-$tag.log 2>&1 || echo "$tag FAILED"
  python3 -c "
import json,glob
s=json.load(open(glob.glob('/tmp/runs/$tag/*/summary.json')[0])); c=s.get('debug_step_cost') or {}
print('$tag', 'loss', s['final_loss'], 'ms/step', round(s['step_ms'],1), 'overhead', c.get('overhead'), 'exact', round(s.get('exact_batches_per_step',0),2), 'bound', round(s.get('bound_batches_per_step',0),2))
open('$OUT/losses.jsonl','a').write(json.dumps({'tag':'$tag','losses':s['losses'],'debug_step_cost':c})+'\n')"
}
D="--debug-config ../configs/debug/moe.json"
LOWP_SPLIT_COPY=read-only run plain-readonly
LOWP_SPLIT_COPY=read-only run debug-readonly-1 $D
LOWP_SPLIT_COPY=read-only run debug-readonly-2 $D
run plain-probe
run debug-probe $D
echo "total $(( $(date +%s) - T0 )) s"
