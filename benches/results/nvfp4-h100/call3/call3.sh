#!/usr/bin/env bash
# NVFP4 call 3: branch-free encoder, compile-time stochastic rounding. CUDA quantize tests
# (special values included); the quantize bench's NVFP4 cases (launcher and tile kernel in one
# process, our copy beside them); Nsight Compute per new kernel (own clocks) with warp stalls.
cd "$(dirname "$0")"
rm -rf bin data && tar -xJf bundle.tar.xz
export LOWP_GOLDENS=$PWD/data/goldens LOWP_TEST_DATA=$PWD/data/tests-data LOWP_TEST_DEVICE=cuda
cd ..
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
T0=$(date +%s)
tk=$(ls .gpu/bin/test-kernels* | head -1); b=$(ls .gpu/bin/bench-quantize* | head -1)
timeout 300 $tk --test-threads=1 cuda::nvfp4_special cuda::quantize_matches_reference cuda::tile_quantize cuda::grouped_quantize cuda::swizzled cuda::golden > $OUT/test-kernels.log 2>&1; echo "kernels rc=$? ($(( $(date +%s) - T0 )) s)"
grep -hE "^test |^test result|panicked|differ" $OUT/test-kernels.log | head -12
T2=$(date +%s)
LOWP_BENCH_FILTER=nvfp4 timeout 150 $b --bench > $OUT/quantize.jsonl 2> /tmp/q.err; echo "bench rc=$? ($(( $(date +%s) - T2 )) s)"; tail -2 /tmp/q.err | cut -c1-200
python3 - $OUT/quantize.jsonl <<'PY'
import json,sys
ours=[json.loads(l) for l in open(sys.argv[1]) if l.startswith('{')]
for d in ours:
    if d['bench']=='copy': print('copy',d['shape'],d['time_us']); continue
    print(f"  {d['format']:14s} {d['kernel']:8s} {d['usage']:10s} {str(d['shape']):12s} {d['time_us']:7.1f} us  ratio {d['ratio_to_copy']:.3f}")
PY
T3=$(date +%s)
: > $OUT/ncu.csv
for spec in "nvfp4 instruction rowwise|nvfp4_rowwise" "nvfp4 instruction columnwise|nvfp4_strip" "nvfp4 instruction both|nvfp4_strip" "nvfp4-rht instruction both|nvfp4_strip" "nvfp4-rht-sr instruction both|nvfp4_strip" "nvfp4-2d instruction both|nvfp4_strip"; do
  IFS='|' read f k <<< "$spec"
  echo "### $f|$k" >> $OUT/ncu.csv
  LOWP_BENCH_FILTER="$f" timeout 60 ncu --clock-control none --kernel-name regex:"$k" --launch-skip 5 --launch-count 1 --section SpeedOfLight --section LaunchStats --section Occupancy --section WarpStateStats --metrics smsp__average_warp_latency_issue_stalled_no_instruction,smsp__pcsamp_warps_issue_stalled_no_instructions,sm__inst_executed_pipe_alu.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_fma.avg.pct_of_peak_sustained_active,smsp__inst_executed.sum --csv $b --bench 2>/dev/null | grep -v '^{' >> $OUT/ncu.csv
done
python3 - $OUT/ncu.csv <<'PY'
import csv,sys
case=None
for r in csv.reader(open(sys.argv[1])):
    if r and r[0].startswith('### '): case=r[0][4:]; continue
    if len(r)>14 and r[12] in ('Duration','DRAM Throughput','Compute (SM) Throughput','Registers Per Thread','Achieved Occupancy','Warp Cycles Per Issued Instruction','sm__inst_executed_pipe_alu.avg.pct_of_peak_sustained_active','sm__inst_executed_pipe_fma.avg.pct_of_peak_sustained_active','smsp__inst_executed.sum','smsp__average_warp_latency_issue_stalled_no_instruction'):
        print(f"{case:42s} {r[12][:40]:40s} {r[14]} {r[13]}")
PY
echo "ncu ($(( $(date +%s) - T3 )) s)"
