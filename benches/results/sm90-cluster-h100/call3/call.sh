#!/bin/bash
# Stop 47, call 2: where the BF16 gap is: SM clock and power while each kernel runs back to back,
# then Nsight Compute of ours and PyTorch's at base clocks (cycle efficiency).
cd benches/sm90_probe
nvcc -O3 -std=c++17 -shared -Xcompiler -fPIC -gencode=arch=compute_90a,code=sm_90a -o libprobe.so harness.cu -lcuda > $OUT/probe-build.txt 2>&1; echo "build rc=$?"
cd ../..
for m in torch ours ours_x2 torch ours torch_dgrad ours_dgrad; do python3 .gpu/clock.py $m 2>&1 | grep -v resident; done
for m in ours torch; do
  NCU=1 timeout 200 ncu --clock-control base --section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --section WarpStateStats --section SchedulerStats --section LaunchStats --section Occupancy --metrics sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_tensor_op_gmma.sum,smsp__cycles_active.avg \
    -k regex:"lowp_grouped|device_kernel" -c 1 -s 3 python3 .gpu/clock.py $m > $OUT/ncu-$m.txt 2>&1; echo "ncu $m rc=$?"
  grep -E "SM Frequency|Duration|Compute \(SM\)|L2 Cache Throughput|DRAM Throughput|Issue Slots|gmma|Stall|No Eligible|Registers Per|Grid Size|Cluster|Shared Memory Config|Dynamic Shared" $OUT/ncu-$m.txt | head -30
done
