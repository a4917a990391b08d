#!/usr/bin/env bash
# MoE 1.9B debugged run of call 9 again (LOWP_SPLIT_COPY=read-only, autotuning off), printing
# every AutoswitchGemm row that switched or released, and the switch log.
cd "$(dirname "$0")"
mkdir -p bin && xz -dc moe_train.xz > bin/moe_train && chmod +x bin/moe_train
[ -s /tmp/corpus.txt ] || find / -name "*.py" -path "*python3*" 2>/dev/null | head -3000 | xargs cat 2>/dev/null | head -c 15000000 > /tmp/corpus.txt
export LOWP_GEMM_AUTOTUNE=0 LOWP_SPLIT_COPY=read-only
timeout 120 bin/moe_train --config ../configs/moe-1.9b.json --recipe ../recipes/current_scaling.json --data /tmp/corpus.txt --steps 100 --quiet --no-checkpoint --out /tmp/runs/dbg --debug-config ../configs/debug/moe.json > /tmp/dbg.log 2>&1; echo "rc=$?"
grep -h "^|" /tmp/dbg.log | head -2
grep -h "^|" /tmp/dbg.log | awk -F'|' 'NR>2 && ($5+0 > 0 || $6+0 > 0)' | head -40
grep -h "^|" /tmp/dbg.log | wc -l
f=$(ls /tmp/runs/dbg/*/debug/autoswitch-rank0.jsonl 2>/dev/null | head -1); echo "switch log: $f"; wc -l $f; head -c 3000 $f
cp $f $OUT/ 2>/dev/null; grep "final loss\|debug cost" /tmp/dbg.log | cut -c1-250
