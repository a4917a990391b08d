#!/usr/bin/env bash
# Grouped GEMMs, the GroupedLinear step and the LayerNormMLP step: ours and PyTorch in turns.
cd "$(dirname "$0")"
rm -rf bin data && tar -xJf bundle.tar.xz
cd ..   # the benches read recipes/ from the repository root
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
nvidia-smi --query-gpu=clocks.sm,power.draw,temperature.gpu --format=csv,noheader -lms 250 > $OUT/smi.csv &
SMI=$!
T0=$(date +%s)
timeout 250 python3 .gpu/layernorm_mlp_torch.py --turns $(ls .gpu/bin/bench-layernorm_mlp*) > $OUT/mlp-turns.jsonl 2> $OUT/mlp-turns.err; echo "mlp turns rc=$? $(( $(date +%s) - T0 )) s"
tail -2 $OUT/mlp-turns.err
grep -h '"compare"\|"impl"' $OUT/mlp-turns.jsonl
T1=$(date +%s)
timeout 300 python3 .gpu/grouped_torch.py --turns $(ls .gpu/bin/bench-grouped*) > $OUT/turns.jsonl 2> $OUT/turns.err; echo "grouped turns rc=$? $(( $(date +%s) - T1 )) s"
tail -2 $OUT/turns.err
kill $SMI
python3 - <<PY
import json
for l in open('$OUT/turns.jsonl'):
  if not l.startswith('{'): continue
  o=json.loads(l)
  if o.get('bench')!='compare': continue
  print(o['case'][:13], o.get('format') or o.get('recipe'), o.get('gemm'), o['shape'], o['dist'][:4], o.get('batch'), o.get('accumulation'), o['peer'], o['ours_us'], o['torch_us'], o['ratio'], o['torch_runs_us'])
PY
