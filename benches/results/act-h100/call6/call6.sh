#!/usr/bin/env bash
# Call 6: A/B of the MoE example at 235M (host-bound) on one machine: the binary of the previous
# stop (d27fbd8, moe_train_old) and this stop's, alternating, CUPTI-traced, cut into steps.
cd "$(dirname "$0")"
mkdir -p bin; xz -dc moe_train.xz > bin/moe_train; xz -dc moe_train_old.xz > bin/moe_train_old; chmod +x bin/moe_train*
cd ..
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
T0=$(date +%s); el() { echo "$(( $(date +%s) - T0 )) s"; }
CI=$(dirname $(find / -name cupti.h -not -path '*/proc/*' 2>/dev/null | head -1)); L=$(find / -name 'libcupti.so*' -not -path '*/proc/*' 2>/dev/null | head -1); CL=$(dirname $L)
CUDAINC=$(dirname $(find / -name cuda.h -path '*include*' -not -path '*/proc/*' 2>/dev/null | head -1))
gcc -O2 -shared -fPIC benches/profile/cupti_trace.c -I$CI -I$CUDAINC -L$CL -l:$(basename $L) -Wl,-rpath,$CL -o /tmp/libcupti_trace.so || exit 1
for spec in "old current_scaling" "new current_scaling" "old current_scaling" "new current_scaling" "old bf16" "new bf16"; do
  read which r <<< "$spec"; bin=.gpu/bin/moe_train; [ $which = old ] && bin=.gpu/bin/moe_train_old
  timeout 100 env CUDA_INJECTION64_PATH=/tmp/libcupti_trace.so LOWP_CUPTI_TRACE=/tmp/moe.csv $bin --config configs/moe-235m.json --recipe recipes/$r.json --steps 40 --quiet --no-checkpoint --out /tmp/runs/$which > /tmp/moe.log 2>&1; echo "moe 235m $spec rc=$? $(el)"; tail -1 /tmp/moe.log | cut -c1-160
  python3 benches/profile/cupti_summary.py /tmp/moe.csv --steps 40 --step-end adamw --skip 4 > /tmp/s.txt 2>&1; echo "##### $spec" >> $OUT/moe-ab.txt; cat /tmp/s.txt >> $OUT/moe-ab.txt; sed -n 2,3p /tmp/s.txt
done
echo "done $(el)"
