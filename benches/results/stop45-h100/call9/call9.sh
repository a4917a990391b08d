#!/usr/bin/env bash
# Call 9 (stop 45): benches/gemm.rs in turns with its PyTorch peer (gemm_torch.py --turns), twice.
cd "$(dirname "$0")"
rm -rf bin data && tar -xJf bundle.tar.xz
cd ..
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
T0=$(date +%s); el() { echo "$(( $(date +%s) - T0 )) s"; }
bg=$(ls .gpu/bin/bench-gemm* | head -1)
for r in 1 2; do
  timeout 250 python3 benches/gemm_torch.py --turns $bg > $OUT/gemm-turns-$r.jsonl 2>/tmp/t.err; echo "turns $r rc=$? $(el)"; tail -2 /tmp/t.err
  grep -h '"compare"' $OUT/gemm-turns-$r.jsonl | grep -v device_flags | python3 -c "
import sys, json
for l in sys.stdin:
    o = json.loads(l)
    if o['compare'] == 'linear_step': print('linear', o['recipe'], o['ours_us'], o.get('speedup_over_torch_bf16'))
    elif o['compare'].startswith('gemm'): print(o['format'], o['m'], o['n'], o['k'], o['ours'], o['torch'], o['ratio'])
"
done
echo "done $(el)"
