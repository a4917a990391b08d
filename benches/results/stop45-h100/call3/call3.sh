#!/usr/bin/env bash
# Call 3 (stop 45): Nsight Compute on the rowwise casts of 16384 x 8192 bf16: the FP8 cast with a
# scale, MXFP8's plane kernel and its unit-per-block kernel (why MXFP8 trails the FP8 cast).
cd "$(dirname "$0")"
rm -rf bin data && tar -xJf bundle.tar.xz
cd ..
bq=$(ls .gpu/bin/bench-quantize* | head -1)
S="--section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats --section MemoryWorkloadAnalysis --section SchedulerStats"
for k in "fp8-e4m3-scale instruction rowwise:^fp8_cast_kernel" "mxfp8-e4m3 instruction rowwise:^mxfp8_rowwise_plane" "mxfp8-e4m3 instruction rowwise:^mxfp8_rowwise_kernel"; do
  f=${k%%:*}; r=${k#*:}
  LOWP_BENCH_FILTER="$f" timeout 100 ncu --clock-control none --kernel-name "regex:$r" --launch-skip 5 --launch-count 1 $S $bq --bench > /tmp/n.txt 2>&1
  echo "== $f $r rc=$?"; cat /tmp/n.txt >> $OUT/ncu.txt
  grep -E "^  [a-z_0-9]+ \(|Duration|DRAM Throughput|Memory Throughput|Compute \(SM\)|Achieved Occupancy|Registers Per|L1/TEX Hit|L2 Hit|Issued Warp|No Eligible|Mem Busy|Max Bandwidth|Warp Cycles Per Issued" /tmp/n.txt | grep -v "^==" | head -24
done
