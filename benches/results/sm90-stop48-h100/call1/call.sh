#!/bin/bash
# Stop 48, call 1: where the BF16 gap stands after the staged epilogue. Probe checks; timing in
# turns with the new order (heating run, alternating order) and the old (peer first in every
# round); cluster twins; the clock64 breakdown per tile; SM clock and power back to back; Nsight
# Compute cycles at base clocks.
set -u
root=$PWD
T0=$(date +%s); el() { echo "$(( $(date +%s) - T0 )) s"; }
nvidia-smi --query-gpu=name,driver_version,power.limit,clocks.max.sm --format=csv,noheader
( cd benches/sm90_probe && nvcc -O3 -std=c++17 -shared -Xcompiler -fPIC -gencode=arch=compute_90a,code=sm_90a -o libprobe.so harness.cu -lcuda > $OUT/probe-build.txt 2>&1; echo "probe build rc=$?" ) &
( cd .gpu && nvcc -O3 -std=c++17 -shared -Xcompiler -fPIC -gencode=arch=compute_90a,code=sm_90a -I../benches/sm90_probe -o libclock.so harness_clock.cu -lcuda > $OUT/clock-build.txt 2>&1; echo "clock build rc=$?" ) &
wait; echo "built $(el)"
cd benches/sm90_probe
timeout 60 python3 probe.py ./libprobe.so --check > $OUT/probe-check.txt 2>&1; echo "check rc=$? $(el)"; grep -c " ok" $OUT/probe-check.txt; grep FAIL $OUT/probe-check.txt | head
fmt() { grep "^time" $1 | sed 's/  */ /g' | cut -d' ' -f2,6- | sed 's/ours//; s/torch//; s/band [0-9]* //'; }
LOWP_ROUNDS=4 timeout 150 python3 probe.py ./libprobe.so --time --selected --x2 --only bf16_tn_256 bf16_tn_256_x2 bf16_nn_256 bf16_nn_256_x2 > $OUT/time-bf16-alternate.txt 2>&1; echo "bf16 alternate rc=$? $(el)"; fmt $OUT/time-bf16-alternate.txt
LOWP_ORDER=peer-first LOWP_ROUNDS=4 timeout 60 python3 probe.py ./libprobe.so --time --selected --only bf16_tn_256 bf16_nn_256 --shapes 8,32768,7168,2048 128,65536,2048,1536 > $OUT/time-bf16-peer-first.txt 2>&1; echo "bf16 peer-first rc=$? $(el)"; fmt $OUT/time-bf16-peer-first.txt
cd "$root"
timeout 60 python3 .gpu/clocks.py .gpu/libclock.so 2>&1 | grep -v resident | tee $OUT/clocks.txt; echo "clocks $(el)"
for m in torch ours ours_x2 torch ours; do SECONDS_ON=3 python3 .gpu/steady.py $m 8,32768,7168,2048 2>&1 | grep -v resident; done | tee $OUT/steady.txt
for m in torch ours torch ours; do SECONDS_ON=3 python3 .gpu/steady.py $m 128,65536,2048,1536 2>&1 | grep -v resident; done | tee -a $OUT/steady.txt; echo "steady $(el)"
ncu_one() { NCU=1 timeout 90 ncu --clock-control base --section SpeedOfLight --metrics sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active,smsp__cycles_active.avg,sm__cycles_elapsed.max,lts__t_bytes.sum,dram__bytes.sum -k regex:"lowp_grouped|device_kernel" -c 1 python3 .gpu/steady.py $1 $2 > $OUT/ncu-$1-$3.txt 2>&1; echo "ncu $1 $2 rc=$? $(el)"; grep -E "Duration|SM Frequency|Elapsed Cycles|Compute \(SM\)|L2 Cache Throughput|DRAM Throughput|gmma|cycles_elapsed|lts__t_bytes|dram__bytes" $OUT/ncu-$1-$3.txt; }
ncu_one ours 8,32768,7168,2048 e8; ncu_one ours_x2 8,32768,7168,2048 e8; ncu_one torch 8,32768,7168,2048 e8
ncu_one ours 128,65536,2048,1536 e128; ncu_one torch 128,65536,2048,1536 e128
ncu_one ours_dgrad 8,32768,7168,2048 e8; ncu_one torch_dgrad 8,32768,7168,2048 e8
cd $OUT && tar -cJf ncu.tar.xz ncu-*.txt && rm -f ncu-*.txt
echo "done $(el)"
