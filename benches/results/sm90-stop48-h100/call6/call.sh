#!/bin/bash
# Stop 48, call 6 (final kernel): the BF16 cases closest to parity with more rounds (8, alternating
# order after a heating run), and the 8-expert dgrad back to back with SM clock and power.
set -u
T0=$(date +%s); el() { echo "$(( $(date +%s) - T0 )) s"; }
( cd benches/sm90_probe && nvcc -O3 -std=c++17 -shared -Xcompiler -fPIC -gencode=arch=compute_90a,code=sm_90a -o libprobe.so harness.cu -lcuda > $OUT/probe-build.txt 2>&1; echo "build rc=$? $(el)" )
( cd benches/sm90_probe && LOWP_ROUNDS=8 timeout 200 python3 probe.py ./libprobe.so --time --selected --only bf16_tn_256 bf16_nn_256 --shapes 8,32768,7168,2048 128,65536,2048,1536 > $OUT/probe-time-bf16.txt 2>&1; echo "time rc=$? $(el)"
  grep "^time" $OUT/probe-time-bf16.txt | sed 's/  */ /g' | cut -d' ' -f2,6- | sed 's/ours//; s/torch//; s/band [0-9]* //' )
for m in torch_dgrad ours_dgrad torch_dgrad ours_dgrad; do SECONDS_ON=3 python3 .gpu/steady.py $m 8,32768,7168,2048 2>&1 | grep -v resident; done | tee $OUT/steady.txt
echo "done $(el)"
