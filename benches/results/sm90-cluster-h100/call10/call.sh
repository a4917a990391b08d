#!/bin/bash
# Stop 47, call 10: the epilogue through a staging buffer (stmatrix) against shuffles (old =
# commit 768f5bb). Then the clock64 breakdown of the new kernel.
F="-O3 -std=c++17 -shared -Xcompiler -fPIC -gencode=arch=compute_90a,code=sm_90a"
( cd benches/sm90_probe && nvcc $F -Xptxas -v -o libprobe.so harness.cu -lcuda > $OUT/probe-build.txt 2>&1; echo "build rc=$?"; grep -i error $OUT/probe-build.txt | head )
( cd .gpu && nvcc $F -I../benches/sm90_probe -o ../benches/sm90_probe/libprobe_old.so harness_old.cu -lcuda > $OUT/probe-build-old.txt 2>&1; echo "build old rc=$?"; grep -i error $OUT/probe-build-old.txt | head )
cd benches/sm90_probe
timeout 120 python3 probe.py ./libprobe.so --check > $OUT/probe-check.txt 2>&1; echo "check rc=$?"; grep -c " ok" $OUT/probe-check.txt; grep FAIL $OUT/probe-check.txt | head
K="bf16_tn_256 bf16_nn_256 bf16_nn_128_pingpong bf16_tn_128_pingpong e4m3_tn_256 e4m3_tn_128_pingpong"
for lib in old new old new; do
  l=./libprobe.so; [ $lib = old ] && l=./libprobe_old.so
  LOWP_ROUNDS=3 timeout 100 python3 probe.py $l --time --selected --only $K > $OUT/time-$lib.txt 2>&1; echo "time $lib rc=$?"
  grep "^time" $OUT/time-$lib.txt | sed 's/  */ /g' | cut -d' ' -f2,6- | sed 's/ours//; s/torch//' | sed "s/^/$lib /"
done
cd ../..
