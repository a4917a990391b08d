#!/bin/bash
# Stop 47, call 4: descriptors from stage 0's plus offsets (new) against computing each (old);
# tile-order bands for the BF16 dgrad.
cd benches/sm90_probe
F="-O3 -std=c++17 -shared -Xcompiler -fPIC -gencode=arch=compute_90a,code=sm_90a"
nvcc $F -Xptxas -v -o libprobe.so harness.cu -lcuda > $OUT/probe-build.txt 2>&1; echo "build rc=$?"
grep -i error $OUT/probe-build.txt | head; grep -A2 "Compiling entry" $OUT/probe-build.txt | grep -i "spill" | sort | uniq -c
nvcc $F -o libprobe_old.so harness_old.cu -lcuda > $OUT/probe-build-old.txt 2>&1; echo "build old rc=$?"
timeout 120 python3 probe.py ./libprobe.so --check > $OUT/probe-check.txt 2>&1; echo "check rc=$?"; grep -c " ok" $OUT/probe-check.txt; grep FAIL $OUT/probe-check.txt | head
S="--shapes 8,32768,7168,2048 16,32768,2048,768"
K="bf16_tn_256 bf16_nn_256 bf16_nn_128_pingpong bf16_tn_128_pingpong e4m3_tn_256 e4m3_tn_128_pingpong"
for lib in old new old new; do
  l=./libprobe.so; [ $lib = old ] && l=./libprobe_old.so
  LOWP_ROUNDS=3 timeout 100 python3 probe.py $l --time --selected --only $K $S > $OUT/time-$lib.txt 2>&1; echo "time $lib rc=$?"
  grep "^time" $OUT/time-$lib.txt | sed 's/  */ /g' | cut -d' ' -f2,6- | sed 's/ours//; s/torch//' | sed "s/^/$lib /"
done
LOWP_ROUNDS=2 timeout 150 python3 probe.py ./libprobe.so --time --only bf16_nn_256 bf16_tn_256 --bands 2,8,16,32,64 --shapes 8,32768,7168,2048 > $OUT/time-bands.txt 2>&1; echo "bands rc=$?"
grep "^time" $OUT/time-bands.txt | sed 's/  */ /g' | cut -d' ' -f2,6- | sed 's/ours//; s/torch//'
