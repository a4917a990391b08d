#!/usr/bin/env bash
# Call 5: the MoE example with the new activation kernels (its SwiGLU experts and the fused
# swiglu op run them): CUPTI traces of 1.9B bf16 and current scaling, 235M current scaling, cut
# into steps (the first 4 left out), to compare with benches/results/trace-h100/call6.
cd "$(dirname "$0")"
[ -d bin ] || { rm -rf bin data && tar -xJf bundle.tar.xz; }
xz -dc moe_train.xz > bin/moe_train && chmod +x bin/moe_train
cd ..
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
T0=$(date +%s); el() { echo "$(( $(date +%s) - T0 )) s"; }
CI=$(dirname $(find / -name cupti.h -not -path '*/proc/*' 2>/dev/null | head -1)); L=$(find / -name 'libcupti.so*' -not -path '*/proc/*' 2>/dev/null | head -1); CL=$(dirname $L)
CUDAINC=$(dirname $(find / -name cuda.h -path '*include*' -not -path '*/proc/*' 2>/dev/null | head -1))
gcc -O2 -shared -fPIC benches/profile/cupti_trace.c -I$CI -I$CUDAINC -L$CL -l:$(basename $L) -Wl,-rpath,$CL -o /tmp/libcupti_trace.so || exit 1
for spec in "moe-1.9b bf16 14" "moe-1.9b current_scaling 14" "moe-235m current_scaling 40"; do
  read cfg r steps <<< "$spec"
  timeout 130 env CUDA_INJECTION64_PATH=/tmp/libcupti_trace.so LOWP_CUPTI_TRACE=/tmp/moe-$cfg-$r.csv .gpu/bin/moe_train --config configs/$cfg.json --recipe recipes/$r.json --steps $steps --quiet --no-checkpoint --out /tmp/runs/$cfg > /tmp/moe.log 2>&1; echo "moe $cfg $r rc=$? $(el)"; tail -1 /tmp/moe.log | cut -c1-200
  python3 -c "import json,glob; s=json.load(open(glob.glob('/tmp/runs/$cfg/$r/summary.json')[0])); print('step_ms', round(s['step_ms'],1), 'loss', round(s['final_loss'],4))" 2>&1 | tail -1
  python3 benches/profile/cupti_summary.py /tmp/moe-$cfg-$r.csv --steps $steps --step-end adamw --skip 4 > /tmp/s.txt 2>&1; echo "##### $spec" >> $OUT/moe-steps.txt; cat /tmp/s.txt >> $OUT/moe-steps.txt; head -3 /tmp/s.txt; grep -i "activation\|swiglu\|silu" /tmp/s.txt | head -4
done
echo "done $(el)"
