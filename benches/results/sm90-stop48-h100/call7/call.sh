#!/bin/bash
# Stop 48, call 7: the probe on the GroupedLinear step's own shape (E = 8, T = 32768,
# K = N = 2048), both FP8 fast-accumulation kernels and the BF16 ones, in turns with PyTorch.
set -u
root=$PWD
T0=$(date +%s); el() { echo "$(( $(date +%s) - T0 )) s"; }
( cd benches/sm90_probe && nvcc -O3 -std=c++17 -shared -Xcompiler -fPIC -gencode=arch=compute_90a,code=sm_90a -o libprobe.so harness.cu -lcuda > $OUT/probe-build.txt 2>&1; echo "build rc=$? $(el)"
  LOWP_ROUNDS=4 timeout 200 python3 probe.py ./libprobe.so --time --only e4m3_tn_256 e4m3_tn_128_pingpong bf16_tn_256 bf16_nn_256 --bands 1,16 --shapes 8,32768,2048,2048 > $OUT/probe-step-shape.txt 2>&1; echo "time rc=$? $(el)"
  grep "^time" $OUT/probe-step-shape.txt | sed 's/  */ /g' | cut -d' ' -f2,6- | sed 's/ours//; s/torch//; s/band [0-9]* //' )
echo "done $(el)"
