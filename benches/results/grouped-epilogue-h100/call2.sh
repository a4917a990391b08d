#!/usr/bin/env bash
# GroupedLinear step with packed rows and the per-expert FP8 scales applied in the output's
# epilogue (with the biases and the unpad, one pass), against the padded-copy path and PyTorch;
# CUDA tests; one MoE run per recipe.
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
    if o.get("bench")=="compare": print(o["recipe"],o["dist"],o["ours_us"] if "ours_us" in o else "",o.get("torch_bf16_us"),o.get("speedup_over_torch_bf16"),o.get("split_reads_per_step"),o.get("blocking_syncs_per_step"))
    elif o.get("bench")=="torch_grouped_linear_step": print("torch",o["dist"],o["time_us"])
PY
for t in bin/test-kernels* bin/test-modules*; do
  echo "=== $t"; "$t" --test-threads=1 > $OUT/$(basename $t).log 2>&1; echo "rc=$?"
  grep -E "^test result|FAILED|panicked" $OUT/$(basename $t).log | head -20
done
find / -name "*.py" -path "*python3*" 2>/dev/null | head -3000 | xargs cat 2>/dev/null | head -c 15000000 > /tmp/corpus.txt
for r in bf16 current_scaling; do
  bin/moe_train --config ../configs/moe-235m.json --recipe ../recipes/$r.json --data /tmp/corpus.txt --steps 150 --quiet --out /tmp/runs/$r > /tmp/moe-$r.log 2>&1; echo "moe $r rc=$?"
  python3 -c "import json,glob;s=json.load(open(glob.glob('/tmp/runs/$r/*/summary.json')[0]));print('$r',s['final_loss'],round(s['step_ms'],1))"
  cp /tmp/runs/$r/*/summary.json $OUT/moe-$r-summary.json
done
