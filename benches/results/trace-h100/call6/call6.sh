#!/usr/bin/env bash
# Call 6: the sum-of-squares kernel (eight pairs in flight) on CUDA: its test and the AdamW tests,
# then CUPTI traces of the MoE example (1.9B bf16 and current scaling, 235M current scaling) to
# read the kernel's time per step against call 5.
cd "$(dirname "$0")"
rm -rf bin data && tar -xJf bundle.tar.xz
xz -dc moe_train.xz > bin/moe_train && chmod +x bin/moe_train
export LOWP_GOLDENS=$PWD/data/goldens LOWP_TEST_DATA=$PWD/data/tests-data LOWP_TEST_DEVICE=cuda
cd ..
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
T0=$(date +%s); el() { echo "$(( $(date +%s) - T0 )) s"; }
tk=$(ls .gpu/bin/test-kernels* | head -1)
timeout 150 $tk --test-threads=4 cuda::sum_squares cuda::fused > $OUT/test-kernels.log 2>&1; echo "kernels rc=$? $(el)"
grep -hE "^test |^test result|FAILED|panicked" $OUT/test-kernels.log | head -30
CI=$(dirname $(find / -name cupti.h -not -path '*/proc/*' 2>/dev/null | head -1)); L=$(find / -name 'libcupti.so*' -not -path '*/proc/*' 2>/dev/null | head -1); CL=$(dirname $L)
CUDAINC=$(dirname $(find / -name cuda.h -path '*include*' -not -path '*/proc/*' 2>/dev/null | head -1))
gcc -O2 -shared -fPIC benches/profile/cupti_trace.c -I$CI -I$CUDAINC -L$CL -l:$(basename $L) -Wl,-rpath,$CL -o /tmp/libcupti_trace.so || exit 1
for spec in "moe-1.9b bf16 14" "moe-1.9b current_scaling 14" "moe-235m current_scaling 40"; do
  read cfg r steps <<< "$spec"
  timeout 110 env CUDA_INJECTION64_PATH=/tmp/libcupti_trace.so LOWP_CUPTI_TRACE=/tmp/moe-$cfg-$r.csv .gpu/bin/moe_train --config configs/$cfg.json --recipe recipes/$r.json --steps $steps --quiet --no-checkpoint --out /tmp/runs/$cfg > /tmp/moe.log 2>&1; echo "moe $cfg $r rc=$? $(el)"; tail -1 /tmp/moe.log | cut -c1-200
  python3 -c "import json,glob; s=json.load(open(glob.glob('/tmp/runs/$cfg/$r/summary.json')[0])); print('step_ms', round(s['step_ms'],1), 'loss', round(s['final_loss'],4))" 2>&1 | tail -1
  python3 benches/profile/cupti_summary.py /tmp/moe-$cfg-$r.csv --steps $steps --step-end adamw --skip 4 > /tmp/s.txt 2>&1; echo "##### $spec" >> $OUT/moe-steps.txt; cat /tmp/s.txt >> $OUT/moe-steps.txt; head -6 /tmp/s.txt; grep "sum_squares\|adamw_kernel" /tmp/s.txt
done
echo "done $(el)"
