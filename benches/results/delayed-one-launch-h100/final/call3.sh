#!/usr/bin/env bash
# Delayed scaling with the unrolled update kernel: GroupedLinear step per recipe against PyTorch;
# MoE 235M: where the step's time goes (--sync-every-step) under current and delayed scaling, the
# binary before this session's change (moe_train_old, commit e8d3e58) beside it; 150-step runs.
cd "$(dirname "$0")"
rm -rf bin data && tar -xJf bundle.tar.xz && xz -dc moe_train.xz > bin/moe_train && xz -dc moe_train_old.xz > bin/moe_train_old && chmod +x bin/moe_train bin/moe_train_old
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
B=$(ls bin/bench-grouped* | head -1)
LOWP_BENCH_FILTER=grouped_linear_step $B --bench > $OUT/steps.jsonl 2> $OUT/steps.err; echo "steps rc=$?"
(cd ../benches && python3 grouped_torch.py --steps-only --ours $OUT/steps.jsonl > $OUT/steps-torch.jsonl 2>&1); echo "torch rc=$?"
python3 - $OUT/steps-torch.jsonl <<'PY'
import json,sys
for l in open(sys.argv[1]):
    if not l.startswith("{"): continue
    o=json.loads(l)
    if o.get("bench")=="compare" and ("delayed" in o["recipe"] or o["recipe"] in ("bf16","current_scaling","current_scaling_shared")): print(o["recipe"],o["dist"],o.get("ours_us",""),o.get("torch_bf16_us"),o.get("speedup_over_torch_bf16"),o.get("split_reads_per_step"),o.get("blocking_syncs_per_step"))
    elif o.get("bench")=="torch_grouped_linear_step": print("torch",o["dist"],o["time_us"])
PY
find / -name "*.py" -path "*python3*" 2>/dev/null | head -3000 | xargs cat 2>/dev/null | head -c 15000000 > /tmp/corpus.txt
summary() { python3 -c "
import json,glob,sys
s=json.load(open(glob.glob('$1/*/summary.json')[0]))
p=s.get('host_phase_ms_per_step',{})
print('$2', 'loss',s['final_loss'],'ms/step',round(s['step_ms'],1),'host',round(s.get('host_ms_per_step',0),1),'fwd',round(p.get('forward',0),1),'bwd',round(p.get('backward',0),1),'opt',round(p.get('optimizer',0),1),'wait',s.get('sync_wait_ms_per_step'))
"; }
for r in current_scaling delayed_scaling; do
  bin/moe_train --config ../configs/moe-235m.json --recipe ../recipes/$r.json --data /tmp/corpus.txt --steps 60 --quiet --sync-every-step --out /tmp/sync/$r > /dev/null 2>&1; summary /tmp/sync/$r "sync $r"
done
bin/moe_train_old --config ../configs/moe-235m.json --recipe ../recipes/delayed_scaling.json --data /tmp/corpus.txt --steps 60 --quiet --sync-every-step --out /tmp/sync/old > /dev/null 2>&1; summary /tmp/sync/old "sync delayed_scaling (before)"
for pass in 1 2; do
  for r in bf16 current_scaling delayed_scaling; do
    bin/moe_train --config ../configs/moe-235m.json --recipe ../recipes/$r.json --data /tmp/corpus.txt --steps 150 --quiet --out /tmp/runs$pass/$r > /dev/null 2>&1; summary /tmp/runs$pass/$r "run$pass $r"
    cp /tmp/runs$pass/$r/*/summary.json $OUT/moe-$r-$pass.json
  done
  bin/moe_train_old --config ../configs/moe-235m.json --recipe ../recipes/delayed_scaling.json --data /tmp/corpus.txt --steps 150 --quiet --out /tmp/runs$pass/old > /dev/null 2>&1; summary /tmp/runs$pass/old "run$pass delayed_scaling (before)"
done
