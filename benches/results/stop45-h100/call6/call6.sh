#!/usr/bin/env bash
# Call 6 (stop 45): the per-expert AutoswitchGemm test with its final device wait, 48 runs, 12 at
# once (it crashed at exit in 3 of 48 before); every CUDA test once more, one process a test; then
# Nsight Compute on the two passes of the FP8 current-scaling and NVFP4 rowwise casts (amax pass,
# then cast) of 16384 x 8192 bf16, to see what bounds each.
cd "$(dirname "$0")"
rm -rf bin data && tar -xJf bundle.tar.xz && chmod +x extra/*
export LOWP_GOLDENS=$PWD/data/goldens LOWP_TEST_DATA=$PWD/data/tests-data LOWP_TEST_DEVICE=cuda
cd ..
T0=$(date +%s); el() { echo "$(( $(date +%s) - T0 )) s"; }
tk=$(ls .gpu/bin/test-kernels* | head -1); tm=$(ls .gpu/bin/test-modules* | head -1); bq=.gpu/extra/bench-quantize
mkdir -p /tmp/crash
one() { timeout 100 $tm --exact cuda::autoswitch_decides_per_expert --test-threads=1 > /tmp/crash/$1.log 2>&1; echo "rc=$?" >> /tmp/crash/$1.log; }
export -f one; export tm
seq 1 48 | xargs -P 12 -I{} bash -c 'one {}'
echo "crash runs $(el): rc=0 in $(grep -l '^rc=0$' /tmp/crash/*.log | wc -l) of 48; others: $(grep -h '^rc=' /tmp/crash/*.log | sort | uniq -c | tr '\n' ' ')"
$tk --list 2>/dev/null | grep '^cuda::' | sed 's/: test$//' > /tmp/k.txt
$tm --list 2>/dev/null | grep '^cuda::' | sed 's/: test$//' > /tmp/m.txt
( grep -E 'quantize_matches|tile_quantize|activation|swizzle|decoded|stats' /tmp/k.txt | sed 's/^/k /'
  grep -vE 'quantize_matches|tile_quantize|activation|swizzle|decoded|stats' /tmp/k.txt | sed 's/^/k /'
  sed 's/^/m /' /tmp/m.txt ) > /tmp/queue.txt
mkdir -p /tmp/logs
run_one() {
  b=$tk; [ "$1" = m ] && b=$tm
  f=/tmp/logs/$1-${2//::/-}.log
  s=$(date +%s); timeout 400 $b --exact "$2" --test-threads=1 > "$f" 2>&1; rc=$?
  echo "$1 $2 rc=$rc $(( $(date +%s) - s )) s"
}
export -f run_one; export tk tm
xargs -P 12 -L 1 bash -c 'run_one "$@"' _ < /tmp/queue.txt > $OUT/tests-summary.txt
echo "tests done $(el)"
echo "passed: $(grep -c 'rc=0 ' $OUT/tests-summary.txt) of $(wc -l < $OUT/tests-summary.txt)"
grep -v 'rc=0 ' $OUT/tests-summary.txt
S="--section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats --section MemoryWorkloadAnalysis --section SchedulerStats"
for k in "fp8-e4m3-current instruction rowwise:^amax_kernel" "fp8-e4m3-current instruction rowwise:^fp8_cast_kernel" "nvfp4 instruction rowwise:^amax_kernel" "nvfp4 instruction rowwise:^nvfp4_rowwise"; do
  f=${k%%:*}; r=${k#*:}
  LOWP_BENCH_FILTER="$f" timeout 100 ncu --clock-control none --kernel-name "regex:$r" --launch-skip 5 --launch-count 1 $S $bq --bench > /tmp/n.txt 2>&1
  echo "== $f $r rc=$?"; echo "== $f $r" >> $OUT/ncu.txt; cat /tmp/n.txt >> $OUT/ncu.txt
  grep -E "^  [a-z_0-9]+ \(|Duration|DRAM Throughput|Compute \(SM\)|Achieved Occupancy|Registers Per|L2 Hit|Issued Warp|No Eligible|Mem Busy|Warp Cycles Per Issued|Stall" /tmp/n.txt | head -20
done
echo "done $(el)"
