#!/usr/bin/env bash
# Call 5 (final tree): CUPTI traces of MoE example steps (235M: host-bound; 1.9B: GPU-bound; bf16
# and current scaling), then the grouped GEMM bench in turns with PyTorch (event timing).
cd "$(dirname "$0")"
[ -d bin ] || { rm -rf bin data && tar -xJf bundle.tar.xz; }
xz -dc moe_train.xz > bin/moe_train && chmod +x bin/moe_train
cd ..
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
T0=$(date +%s); el() { echo "$(( $(date +%s) - T0 )) s"; }
CI=$(dirname $(find / -name cupti.h -not -path '*/proc/*' 2>/dev/null | head -1)); L=$(find / -name 'libcupti.so*' -not -path '*/proc/*' 2>/dev/null | head -1); CL=$(dirname $L)
CUDAINC=$(dirname $(find / -name cuda.h -path '*include*' -not -path '*/proc/*' 2>/dev/null | head -1))
gcc -O2 -shared -fPIC benches/profile/cupti_trace.c -I$CI -I$CUDAINC -L$CL -l:$(basename $L) -Wl,-rpath,$CL -o /tmp/libcupti_trace.so || exit 1
for spec in "moe-235m bf16 40" "moe-235m current_scaling 40" "moe-1.9b bf16 14" "moe-1.9b current_scaling 14"; do
  read cfg r steps <<< "$spec"
  timeout 110 env CUDA_INJECTION64_PATH=/tmp/libcupti_trace.so LOWP_CUPTI_TRACE=/tmp/moe-$cfg-$r.csv .gpu/bin/moe_train --config configs/$cfg.json --recipe recipes/$r.json --steps $steps --quiet --no-checkpoint --out /tmp/runs/$cfg > /tmp/moe.log 2>&1; echo "moe $cfg $r rc=$? $(el)"; tail -1 /tmp/moe.log | cut -c1-200
  python3 -c "import json,glob; s=json.load(open(glob.glob('/tmp/runs/$cfg/$r/summary.json')[0])); print('step_ms', round(s['step_ms'],1), 'loss', round(s['final_loss'],4))" 2>&1 | tail -1
  python3 benches/profile/cupti_summary.py /tmp/moe-$cfg-$r.csv --split-ms 20 --top 8 > /tmp/s.txt 2>&1; echo "##### $spec" >> $OUT/moe-traces.txt; cat /tmp/s.txt >> $OUT/moe-traces.txt; sed -n '/== segment/,/^GPU time/p' /tmp/s.txt; grep -A6 "idle gaps per" /tmp/s.txt
done
cd /tmp && tar -cJf $OUT/moe-traces.tar.xz moe-*.csv; cd - > /dev/null
timeout 320 python3 benches/grouped_torch.py --turns $(ls .gpu/bin/bench-grouped* | head -1) > $OUT/grouped-turns.jsonl 2> /tmp/g.err; echo "grouped turns rc=$? $(el)"; tail -2 /tmp/g.err
python3 - $OUT/grouped-turns.jsonl <<'PY'
import json,sys
for l in open(sys.argv[1]):
  if not l.startswith('{'): continue
  o=json.loads(l)
  if o.get('bench')!='compare': continue
  print(o['case'][:13], o.get('format') or o.get('recipe'), o.get('gemm'), o['shape'], o['dist'][:4], o.get('batch'), o.get('accumulation'), o['peer'], o['ours_us'], o['torch_us'], o['ratio'])
PY
echo "done $(el)"
