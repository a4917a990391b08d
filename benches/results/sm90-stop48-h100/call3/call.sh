#!/bin/bash
# Stop 48, call 3: the tile's first wgmma overwriting the accumulators instead of zeroing them
# (new) against call 2's kernel with TMA stores (tma = call 2's "nohint"), and a variant with four
# 8 KiB staging buffers per consumer warpgroup and one stage fewer (x4: 3 stages for the 128 x 256
# kernels; its BF16 cooperative kernels only). Probe checks, clock64 breakdown, builds in turns.
set -u
root=$PWD
T0=$(date +%s); el() { echo "$(( $(date +%s) - T0 )) s"; }
F="-O3 -std=c++17 -shared -Xcompiler -fPIC -gencode=arch=compute_90a,code=sm_90a"
P=benches/sm90_probe
( cd $P && nvcc $F -o libprobe.so harness.cu -lcuda > $OUT/build-new.txt 2>&1; echo "build new rc=$?" ) &
for v in nohint x4 clock; do ( cd .gpu && nvcc $F -I../$P -o ../$P/libprobe_$v.so harness_$v.cu -lcuda > $OUT/build-$v.txt 2>&1; echo "build $v rc=$?" ) & done
wait; echo "built $(el)"; grep -il " error" $OUT/build-*.txt
cd $P
timeout 60 python3 probe.py ./libprobe.so --check > $OUT/probe-check.txt 2>&1; echo "check rc=$? $(el)"; grep -c " ok" $OUT/probe-check.txt; grep FAIL $OUT/probe-check.txt | head
timeout 60 python3 probe.py ./libprobe_x4.so --check > $OUT/probe-check-x4.txt 2>&1; echo "check x4 rc=$? $(el)"; grep -E "check bf16_(tn|nn)_256 " $OUT/probe-check-x4.txt | grep -c " ok"
cd "$root"
timeout 60 python3 .gpu/clocks.py $P/libprobe_clock.so 2>&1 | grep -v resident | tee $OUT/clocks.txt; echo "clocks $(el)"
LOWP_AB_CASES="bf16 fprop,bf16 dgrad" LOWP_ROUNDS=4 timeout 150 python3 .gpu/ab.py tma=$P/libprobe_nohint.so new=$P/libprobe.so x4=$P/libprobe_x4.so > $OUT/ab-bf16.txt 2>&1; echo "ab bf16 rc=$? $(el)"
sed 's/  */ /g' $OUT/ab-bf16.txt | grep "^ab" | cut -d' ' -f2-
LOWP_AB_CASES="fp8 fprop fast,fp8 dgrad fast,fp8 dgrad split" LOWP_ROUNDS=4 timeout 150 python3 .gpu/ab.py tma=$P/libprobe_nohint.so new=$P/libprobe.so > $OUT/ab-fp8.txt 2>&1; echo "ab fp8 rc=$? $(el)"
sed 's/  */ /g' $OUT/ab-fp8.txt | grep "^ab" | cut -d' ' -f2-
echo "done $(el)"
