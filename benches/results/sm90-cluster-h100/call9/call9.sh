#!/bin/bash
# Stop 47, call 9: clock64 breakdown per tile of the cooperative BF16 kernels (instrumented copy).
cd .gpu && nvcc -O3 -std=c++17 -shared -Xcompiler -fPIC -gencode=arch=compute_90a,code=sm_90a -I../benches/sm90_probe -o libclock.so harness_clock.cu -lcuda > $OUT/build.txt 2>&1; echo "build rc=$?"; grep -i error $OUT/build.txt | head; cd ..
timeout 200 python3 .gpu/clocks.py .gpu/libclock.so 2>&1 | grep -v resident | tee $OUT/clocks.txt
