#!/bin/bash
# Stop 47, call 1: the cluster (B multicast) kernels: build, check, BF16 timing against the
# unclustered kernels and PyTorch in turns.
cd benches/sm90_probe
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
T0=$(date +%s); el() { echo "$(( $(date +%s) - T0 )) s"; }
nvcc -O3 -std=c++17 -shared -Xcompiler -fPIC -gencode=arch=compute_90a,code=sm_90a -Xptxas -v -o libprobe.so harness.cu -lcuda > $OUT/probe-build.txt 2>&1; echo "build rc=$? $(el)"
grep -i "error" $OUT/probe-build.txt | head -20
grep -A2 "Compiling entry" $OUT/probe-build.txt | grep -i "spill" | sort | uniq -c
timeout 120 python3 probe.py ./libprobe.so --check > $OUT/probe-check.txt 2>&1; echo "check rc=$? $(el)"; grep -c " ok" $OUT/probe-check.txt; grep -E "FAIL|resident|Error|error" $OUT/probe-check.txt | head -30; tail -3 $OUT/probe-check.txt
B="bf16_tn_256 bf16_tn_256_x2 bf16_nn_256 bf16_nn_256_x2 bf16_nn_128_pingpong bf16_nn_128_pingpong_x2 bf16_tn_128_pingpong bf16_tn_128_pingpong_x2 e4m3_tn_256 e4m3_tn_256_x2 e4m3_tn_128_pingpong e4m3_tn_128_pingpong_x2 e4m3_tn_split_128 e4m3_tn_split_128_x2"
LOWP_ROUNDS=3 timeout 300 python3 probe.py ./libprobe.so --time --selected --x2 --only $B > $OUT/probe-time.txt 2>&1; echo "time rc=$? $(el)"
grep "^time" $OUT/probe-time.txt | sed 's/  */ /g' | cut -d' ' -f2,6- | sed 's/ours//; s/torch//'
tail -3 $OUT/probe-time.txt
