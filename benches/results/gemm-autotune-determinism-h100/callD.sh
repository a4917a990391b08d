#!/usr/bin/env bash
# CUDA module tests on the final code; MoE runs: are GEMM autotune choices the cause of the
# final loss differing between runs of one binary?
cd "$(dirname "$0")"
rm -rf bin data && tar -xJf bundle.tar.xz && xz -dc moe_train.xz > bin/moe_train && chmod +x bin/moe_train
export LOWP_GOLDENS=$PWD/data/goldens LOWP_TEST_DATA=$PWD/data/tests-data LOWP_TEST_DEVICE=cuda
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
for t in bin/test-modules*; do
  echo "=== $t"; "$t" --test-threads=1 > $OUT/$(basename $t).log 2>&1; echo "rc=$?"
  grep -E "^test result|FAILED|panicked" $OUT/$(basename $t).log | head -20
done
find / -name "*.py" -path "*python3*" 2>/dev/null | head -3000 | xargs cat 2>/dev/null | head -c 15000000 > /tmp/corpus.txt
M="bin/moe_train --config ../configs/moe-235m.json --recipe ../recipes/current_scaling.json --data /tmp/corpus.txt --steps 150 --quiet"
for i in 1 2 3 4 5; do
  LOWP_GEMM_AUTOTUNE_LOG=1 $M --out /tmp/runs/tuned$i > /tmp/tuned$i.log 2>&1; echo "tuned$i rc=$?"
  grep '^lowp-autotune' /tmp/tuned$i.log | sed 's/ ms .*//' | sort > $OUT/choices-tuned$i.txt
  python3 -c "import json,glob;s=json.load(open(glob.glob('/tmp/runs/tuned$i/*/summary.json')[0]));print('tuned$i',s['final_loss'],round(s['step_ms'],1))"
done
for i in 1 2 3; do
  LOWP_GEMM_AUTOTUNE=0 $M --out /tmp/runs/heur$i > /tmp/heur$i.log 2>&1; echo "heur$i rc=$?"
  python3 -c "import json,glob;s=json.load(open(glob.glob('/tmp/runs/heur$i/*/summary.json')[0]));print('heur$i',s['final_loss'],round(s['step_ms'],1))"
done
cd $OUT && wc -l choices-tuned*.txt && for i in 2 3 4 5; do echo "diff tuned1 tuned$i: $(diff choices-tuned1.txt choices-tuned$i.txt | grep -c '^<')"; done
diff choices-tuned1.txt choices-tuned2.txt | head -6
grep '^lowp-autotune' /tmp/tuned1.log | head -3
