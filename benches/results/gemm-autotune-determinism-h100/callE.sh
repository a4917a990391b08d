#!/usr/bin/env bash
# GEMM tuning files: CUDA module tests, then MoE runs sharing one tuning file.
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
for i in 1 2 3; do
  LOWP_GEMM_AUTOTUNE_LOG=1 $M --gemm-tuning /tmp/tuning.json --out /tmp/runs/file$i > /tmp/file$i.log 2>&1; echo "file$i rc=$?"
  echo "  timed $(grep -c 'candidate' /tmp/file$i.log), from the table $(grep -c "tuning table's" /tmp/file$i.log); $(grep 'GEMM tuning' /tmp/file$i.log | tr '\n' ' ')"
  python3 -c "import json,glob;s=json.load(open(glob.glob('/tmp/runs/file$i/*/summary.json')[0]));print('file$i',s['final_loss'],round(s['step_ms'],1))"
done
for i in 1 2; do
  $M --out /tmp/runs/plain$i > /tmp/plain$i.log 2>&1; echo "plain$i rc=$?"
  python3 -c "import json,glob;s=json.load(open(glob.glob('/tmp/runs/plain$i/*/summary.json')[0]));print('plain$i',s['final_loss'],round(s['step_ms'],1))"
done
cp /tmp/tuning.json $OUT/; head -c 600 /tmp/tuning.json
