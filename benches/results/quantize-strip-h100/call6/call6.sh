#!/usr/bin/env bash
# Call 6: the MoE example (235M) under block_scaling and mxfp8, the binary of stop 38's tree
# (old) and of this stop's tree (new) alternating, one tuning file per recipe; bf16 once.
cd "$(dirname "$0")"
mkdir -p bin && xz -dc moe_train.xz > bin/moe_train && xz -dc moe_train_old.xz > bin/moe_train_old && chmod +x bin/*
[ -s /tmp/corpus.txt ] || find / -name "*.py" -path "*python3*" 2>/dev/null | head -3000 | xargs cat 2>/dev/null | head -c 15000000 > /tmp/corpus.txt
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
summary() { python3 -c "
import json,glob
s=json.load(open(glob.glob('$1/*/summary.json')[0]))
print('$2', 'loss',round(s['final_loss'],6),'ms/step',round(s['step_ms'],2))
"; }
moe() { # moe BIN RECIPE STEPS TAG
  local bin=$1 r=$2 steps=$3 tag=$4; local t0=$(date +%s)
  timeout 120 bin/$bin --config ../configs/moe-235m.json --recipe ../recipes/$r.json --data /tmp/corpus.txt --steps $steps --quiet --no-checkpoint --out /tmp/runs/$tag --gemm-tuning /tmp/tune-$r.json > /tmp/runs-$tag.log 2>&1 || { echo "$tag FAILED"; tail -3 /tmp/runs-$tag.log | cut -c1-300; }
  summary /tmp/runs/$tag "$tag ($(( $(date +%s) - t0 )) s)"
  python3 -c "import json,glob; print(json.dumps({'tag': '$tag', **json.load(open(glob.glob('/tmp/runs/$tag/*/summary.json')[0]))}))" >> $OUT/moe-summaries.jsonl 2>/dev/null
}
T0=$(date +%s)
moe moe_train bf16 100 bf16-new
for r in block_scaling mxfp8; do
  for pass in 1 2; do
    moe moe_train_old $r 100 $r-old-$pass
    moe moe_train $r 100 $r-new-$pass
  done
done
echo "total $(( $(date +%s) - T0 )) s"
