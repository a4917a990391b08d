#!/bin/bash
# Stop 48, call 2: the epilogue's TMA stores (new) against the kernel of call 1 (old, global stores
# from the staging buffer) and against new without the try_wait suspend hint (nohint): probe
# checks, clock64 breakdown, the builds in turns, the selected kernels in turns with PyTorch,
# SM clock and power back to back.
set -u
root=$PWD
T0=$(date +%s); el() { echo "$(( $(date +%s) - T0 )) s"; }
F="-O3 -std=c++17 -shared -Xcompiler -fPIC -gencode=arch=compute_90a,code=sm_90a"
P=benches/sm90_probe
( cd $P && nvcc $F -o libprobe.so harness.cu -lcuda > $OUT/build-new.txt 2>&1; echo "build new rc=$?" ) &
for v in old nohint clock; do ( cd .gpu && nvcc $F -I../$P -o ../$P/libprobe_$v.so harness_$v.cu -lcuda > $OUT/build-$v.txt 2>&1; echo "build $v rc=$?" ) & done
wait; echo "built $(el)"; grep -il " error" $OUT/build-*.txt
cd $P
timeout 60 python3 probe.py ./libprobe.so --check > $OUT/probe-check.txt 2>&1; echo "check rc=$? $(el)"; grep -c " ok" $OUT/probe-check.txt; grep FAIL $OUT/probe-check.txt | head
cd "$root"
timeout 60 python3 .gpu/clocks.py $P/libprobe_clock.so 2>&1 | grep -v resident | tee $OUT/clocks.txt; echo "clocks $(el)"
LOWP_ROUNDS=4 timeout 150 python3 .gpu/ab.py old=$P/libprobe_old.so new=$P/libprobe.so nohint=$P/libprobe_nohint.so > $OUT/ab.txt 2>&1; echo "ab rc=$? $(el)"
sed 's/  */ /g' $OUT/ab.txt | grep "^ab" | cut -d' ' -f2-
cd $P
LOWP_ROUNDS=4 timeout 200 python3 probe.py ./libprobe.so --time --selected > $OUT/probe-time.txt 2>&1; echo "time rc=$? $(el)"
grep "^time" $OUT/probe-time.txt | sed 's/  */ /g' | cut -d' ' -f2,6- | sed 's/ours//; s/torch//; s/band [0-9]* //'
cd "$root"
for m in torch ours torch ours; do SECONDS_ON=3 python3 .gpu/steady.py $m 8,32768,7168,2048 2>&1 | grep -v resident; done | tee $OUT/steady.txt
for m in torch_dgrad ours_dgrad; do SECONDS_ON=3 python3 .gpu/steady.py $m 8,32768,7168,2048 2>&1 | grep -v resident; done | tee -a $OUT/steady.txt
echo "done $(el)"
