#!/usr/bin/env bash
# Delayed scaling in one launch per module direction (update kernel; CUDA casts record into the
# history themselves): GroupedLinear step per recipe against PyTorch; MoE 235M per recipe.
cd "$(dirname "$0")"
rm -rf bin data && tar -xJf bundle.tar.xz && xz -dc moe_train.xz > bin/moe_train && chmod +x bin/moe_train
export LOWP_GOLDENS=$PWD/data/goldens LOWP_TEST_DATA=$PWD/data/tests-data LOWP_TEST_DEVICE=cuda
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
B=$(ls bin/bench-grouped* | head -1)
LOWP_BENCH_FILTER=grouped_linear_step $B --bench > $OUT/steps.jsonl 2> $OUT/steps.err; echo "steps rc=$?"
(cd ../benches && python3 grouped_torch.py --steps-only --ours $OUT/steps.jsonl > $OUT/steps-torch.jsonl 2>&1); echo "torch rc=$?"
python3 - $OUT/steps-torch.jsonl <<'PY'
import json,sys
for l in open(sys.argv[1]):
    if not l.startswith("{"): continue
    o=json.loads(l)
    if o.get("bench")=="compare": print(o["recipe"],o["dist"],o.get("ours_us",""),o.get("torch_bf16_us"),o.get("speedup_over_torch_bf16"),o.get("split_reads_per_step"),o.get("blocking_syncs_per_step"))
    elif o.get("bench")=="torch_grouped_linear_step": print("torch",o["dist"],o["time_us"])
PY
find / -name "*.py" -path "*python3*" 2>/dev/null | head -3000 | xargs cat 2>/dev/null | head -c 15000000 > /tmp/corpus.txt
for pass in 1 2; do
for r in bf16 current_scaling delayed_scaling; do
  bin/moe_train --config ../configs/moe-235m.json --recipe ../recipes/$r.json --data /tmp/corpus.txt --steps 150 --quiet --out /tmp/runs$pass/$r > $OUT/moe-$r-$pass.log 2>&1; echo "moe $r pass $pass rc=$?"
  python3 -c "import json,glob;s=json.load(open(glob.glob('/tmp/runs$pass/$r/*/summary.json')[0]));print('$r',s['final_loss'],round(s['step_ms'],1))"
  cp /tmp/runs$pass/$r/*/summary.json $OUT/moe-$r-$pass-summary.json
done
done
