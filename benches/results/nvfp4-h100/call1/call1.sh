#!/usr/bin/env bash
# NVFP4 call 1: CUDA quantize kernel tests on the new NVFP4 kernels; the quantize bench (new
# kernels and the tile kernel in one process) with PyTorch's copy and NVFP4 peer in the same call;
# Nsight Compute at the GPU's own clocks for one launch of each new kernel and of the amax passes.
cd "$(dirname "$0")"
rm -rf bin data && tar -xJf bundle.tar.xz
export LOWP_GOLDENS=$PWD/data/goldens LOWP_TEST_DATA=$PWD/data/tests-data LOWP_TEST_DEVICE=cuda
cd ..
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
T0=$(date +%s)
tk=$(ls .gpu/bin/test-kernels* | head -1); b=$(ls .gpu/bin/bench-quantize* | head -1)
timeout 250 $tk --test-threads=1 cuda::grouped cuda::quantize_matches_reference cuda::tile_quantize cuda::swizzled cuda::golden cuda::dequantize > $OUT/test-kernels.log 2>&1; echo "kernels rc=$? ($(( $(date +%s) - T0 )) s)"
grep -hE "^test |^test result|panicked" $OUT/test-kernels.log | head -12
T2=$(date +%s)
timeout 150 $b --bench > $OUT/quantize.jsonl 2> /tmp/q.err; echo "bench rc=$? ($(( $(date +%s) - T2 )) s)"; tail -2 /tmp/q.err | cut -c1-200
timeout 150 python3 benches/quantize_torch.py --formats nvfp4 > $OUT/quantize-torch.jsonl 2>/tmp/qt.err; echo "torch rc=$? ($(( $(date +%s) - T2 )) s)"; tail -2 /tmp/qt.err | cut -c1-200
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
: > $OUT/ncu-own-clocks.csv
for spec in "nvfp4 instruction rowwise|nvfp4_rowwise" "nvfp4 instruction columnwise|nvfp4_strip" "nvfp4 instruction both|nvfp4_strip" "nvfp4-rht instruction columnwise|nvfp4_strip" "nvfp4-rht-sr instruction both|nvfp4_strip" "nvfp4 instruction rowwise|amax_kernel" "nvfp4-rht instruction columnwise|amax_rht" "nvfp4-2d instruction both|nvfp4_strip"; do
  IFS='|' read f k <<< "$spec"
  echo "### $f|$k" >> $OUT/ncu-own-clocks.csv
  LOWP_BENCH_FILTER="$f" timeout 60 ncu --clock-control none --kernel-name regex:"$k" --launch-skip 10 --launch-count 1 --section SpeedOfLight --section LaunchStats --section Occupancy --csv $b --bench 2>/dev/null | grep -v '^{' >> $OUT/ncu-own-clocks.csv
done
python3 - $OUT/ncu-own-clocks.csv <<'PY'
import csv,sys
case=None; h=None
for r in csv.reader(open(sys.argv[1])):
    if r and r[0].startswith('### '): case=r[0][4:]; h=None; continue
    if 'Metric Name' in r: h=r; continue
    if h and len(r)>=len(h)-1 and r[h.index('Metric Name')] in ('Duration','DRAM Throughput','Compute (SM) Throughput','Registers Per Thread','Achieved Occupancy'):
        print(case, r[h.index('Metric Name')], r[h.index('Metric Value')], r[h.index('Metric Unit')])
PY
echo "ncu ($(( $(date +%s) - T3 )) s)"
