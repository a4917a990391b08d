#!/usr/bin/env bash
# Quantize call 3 (final tree): CUDA kernel and module suites; quantize bench and its PyTorch peer
# (eager + torch.compile) in the same call; Nsight Compute at the GPU's own clocks
# (--clock-control none) for one launch of each rowwise and columnwise kernel, to set the kernels'
# GPU time beside the bench's per-call wall clock; the Linear step against PyTorch.
cd "$(dirname "$0")"
rm -rf bin data && tar -xJf bundle.tar.xz
export LOWP_GOLDENS=$PWD/data/goldens LOWP_TEST_DATA=$PWD/data/tests-data LOWP_TEST_DEVICE=cuda
cd ..
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
T0=$(date +%s)
tk=$(ls .gpu/bin/test-kernels* | head -1); tm=$(ls .gpu/bin/test-modules* | head -1)
b=$(ls .gpu/bin/bench-quantize* | head -1); g=$(ls .gpu/bin/bench-gemm* | head -1)
timeout 280 $tk --test-threads=1 > $OUT/test-kernels.log 2>&1; echo "kernels rc=$? ($(( $(date +%s) - T0 )) s)"
grep -hE "^test result|FAILED|panicked" $OUT/test-kernels.log | head -10
T1=$(date +%s)
timeout 150 $tm --test-threads=1 > $OUT/test-modules.log 2>&1; echo "modules rc=$? ($(( $(date +%s) - T1 )) s)"
grep -hE "^test result|FAILED|panicked" $OUT/test-modules.log | head -10
T2=$(date +%s)
timeout 150 $b --bench > $OUT/quantize.jsonl 2> /tmp/q.err; echo "bench rc=$? ($(( $(date +%s) - T2 )) s)"; tail -2 /tmp/q.err | cut -c1-200
timeout 200 python3 benches/quantize_torch.py > $OUT/quantize-torch.jsonl 2>/tmp/qt.err; echo "torch rc=$? ($(( $(date +%s) - T2 )) s)"
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
        if d['bench']!='quantize' or d['shape']!=shape or d['encoder']!='instruction' or d['format'].startswith('nvfp4-'): continue
        vs_torch_copy=d['gbps']/(4*n/tc/1e3)
        c=comp.get((d['format'],d['usage']))
        print(f"  {d['format']:18s} {d.get('kernel','-'):8s} {d['usage']:10s} {d['time_us']:7.1f} us host {d.get('host_us',0):5.1f}  /torch-copy {vs_torch_copy:.3f}  compile {c if c else '-'}  speed vs compile {c/d['time_us'] if c else 0:.2f}")
PY
T3=$(date +%s)
if command -v ncu >/dev/null; then
  : > $OUT/ncu-own-clocks.csv
  for spec in "fp8-e4m3-scale instruction rowwise|fp8_cast" "mxfp8-e4m3 instruction rowwise|mxfp8_rowwise" "fp8-block-1x128 instruction rowwise|fp8_block_kernel" "mxfp8-e4m3 instruction columnwise|mxfp8_strip" "fp8-block-1x128 instruction columnwise|fp8_block_transposed" "fp8-block-1x128 instruction both|fp8_block_transposed" "mxfp8-e4m3 instruction both|mxfp8_strip"; do
    IFS='|' read f k <<< "$spec"
    echo "### $f|$k" >> $OUT/ncu-own-clocks.csv
    LOWP_BENCH_FILTER="$f" timeout 60 ncu --clock-control none --kernel-name regex:"$k" --launch-skip 10 --launch-count 1 --section SpeedOfLight --csv $b --bench 2>/dev/null | grep -v '^{' >> $OUT/ncu-own-clocks.csv
  done
  python3 - $OUT/ncu-own-clocks.csv <<'PY'
import csv,sys
case=None; h=None
for r in csv.reader(open(sys.argv[1])):
    if r and r[0].startswith('### '): case=r[0][4:]; h=None; continue
    if 'Metric Name' in r: h=r; continue
    if h and len(r)==len(h) and r[h.index('Metric Name')] in ('Duration','DRAM Throughput'):
        print(case, r[h.index('Metric Name')], r[h.index('Metric Value')], r[h.index('Metric Unit')])
PY
  echo "ncu ($(( $(date +%s) - T3 )) s)"
fi
T4=$(date +%s)
LOWP_BENCH_FILTER=linear_step timeout 150 $g --bench > $OUT/gemm.jsonl 2>/tmp/g.err; echo "gemm rc=$? ($(( $(date +%s) - T4 )) s)"
(cd benches && timeout 150 python3 gemm_torch.py --ours $OUT/gemm.jsonl > $OUT/gemm-torch.jsonl 2>/tmp/gt.err); echo "torch gemm rc=$? ($(( $(date +%s) - T4 )) s)"
grep -h '"compare": "linear_step"' $OUT/gemm-torch.jsonl
echo "total $(( $(date +%s) - T0 )) s"
