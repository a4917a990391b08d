#!/bin/bash
# Stop 47, call 7: BF16 dgrad through the TN kernel over a transposed weight copy, against the NN
# kernel over W as stored and PyTorch.
cd benches/sm90_probe
nvcc -O3 -std=c++17 -shared -Xcompiler -fPIC -gencode=arch=compute_90a,code=sm_90a -o libprobe.so harness.cu -lcuda > $OUT/probe-build.txt 2>&1; echo "build rc=$?"
cd ../..
LOWP_ROUNDS=3 timeout 300 python3 .gpu/dgrad_tn.py 2>&1 | grep -v resident | tee $OUT/dgrad-tn.txt
