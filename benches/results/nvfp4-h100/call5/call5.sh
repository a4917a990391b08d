#!/usr/bin/env bash
# NVFP4 call 5 (final tree): the whole CUDA kernel suite and the module suite; the quantize bench
# (every format; NVFP4 with the tile kernel beside it) with PyTorch's copy and NVFP4 peer in the
# same call; Nsight Compute at the GPU's own clocks for one launch of each NVFP4 kernel and amax pass.
cd "$(dirname "$0")"
rm -rf bin data && tar -xJf bundle.tar.xz
export LOWP_GOLDENS=$PWD/data/goldens LOWP_TEST_DATA=$PWD/data/tests-data LOWP_TEST_DEVICE=cuda
cd ..
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
T0=$(date +%s)
tk=$(ls .gpu/bin/test-kernels* | head -1); tm=$(ls .gpu/bin/test-modules* | head -1); b=$(ls .gpu/bin/bench-quantize* | head -1)
timeout 260 $tk --test-threads=6 > $OUT/test-kernels.log 2>&1; echo "kernels rc=$? ($(( $(date +%s) - T0 )) s)"
grep -hE "^test result|FAILED|panicked" $OUT/test-kernels.log | head -10
T1=$(date +%s)
timeout 120 $tm --test-threads=1 > $OUT/test-modules.log 2>&1; echo "modules rc=$? ($(( $(date +%s) - T1 )) s)"
grep -hE "^test result|FAILED|panicked" $OUT/test-modules.log | head -10
T2=$(date +%s)
timeout 100 $b --bench > $OUT/quantize.jsonl 2> /tmp/q.err; echo "bench rc=$? ($(( $(date +%s) - T2 )) s)"; tail -2 /tmp/q.err | cut -c1-200
timeout 80 python3 benches/quantize_torch.py --formats nvfp4 > $OUT/quantize-torch.jsonl 2>/tmp/qt.err; echo "torch rc=$? ($(( $(date +%s) - T2 )) s)"
python3 - $OUT/quantize.jsonl $OUT/quantize-torch.jsonl <<'PY'
import json,sys
ours=[json.loads(l) for l in open(sys.argv[1]) if l.startswith('{')]
torch=[json.loads(l) for l in open(sys.argv[2]) if l.startswith('{')]
for shape in ([16384,8192],[4096,4096]):
    tc=[t for t in torch if t['bench']=='torch-copy' and t['shape']==shape][0]['time_us']
    oc=[o for o in ours if o['bench']=='copy' and o['shape']==shape][0]['time_us']
    print('shape',shape,'torch copy',tc,'our copy',oc)
    comp={(t['format'],t['usage']):t['time_us'] for t in torch if t['bench']=='torch-quantize' and t['mode']=='compile' and t['shape']==shape}
    n=shape[0]*shape[1]
    for d in ours:
        if d['bench']!='quantize' or d['shape']!=shape or d['encoder']!='instruction': continue
        vs_torch_copy=d['gbps']/(4*n/tc/1e3)
        c=comp.get((d['format'],d['usage']))
        print(f"  {d['format']:18s} {d.get('kernel','-'):8s} {d['usage']:10s} {d['time_us']:7.1f} us host {d.get('host_us',0):5.1f}  /torch-copy {vs_torch_copy:.3f}  compile {c if c else '-'}")
PY
T3=$(date +%s)
: > $OUT/ncu.csv
for spec in "nvfp4 instruction rowwise|nvfp4_rowwise" "nvfp4 instruction columnwise|nvfp4_strip" "nvfp4 instruction both|nvfp4_strip" "nvfp4-2d instruction both|nvfp4_strip" "nvfp4-rht instruction columnwise|nvfp4_strip" "nvfp4 instruction rowwise|amax_kernel" "nvfp4-rht instruction columnwise|amax_rht"; do
  IFS='|' read f k <<< "$spec"
  echo "### $f|$k" >> $OUT/ncu.csv
  LOWP_BENCH_FILTER="$f" timeout 50 ncu --clock-control none --kernel-name regex:"$k" --launch-skip 5 --launch-count 1 --section SpeedOfLight --section LaunchStats --metrics sm__inst_executed_pipe_alu.avg.pct_of_peak_sustained_active --csv $b --bench 2>/dev/null | grep -v '^{' >> $OUT/ncu.csv
done
python3 - $OUT/ncu.csv <<'PY'
import csv,sys
case=None
for r in csv.reader(open(sys.argv[1])):
    if r and r[0].startswith('### '): case=r[0][4:]; continue
    if len(r)>14 and r[12] in ('Duration','DRAM Throughput','Registers Per Thread','sm__inst_executed_pipe_alu.avg.pct_of_peak_sustained_active'):
        print(f"{case:42s} {r[12][:30]:30s} {r[14]} {r[13]}")
PY
echo "ncu ($(( $(date +%s) - T3 )) s)"
