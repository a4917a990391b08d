#!/usr/bin/env bash
# Quantize call 2: CUDA quantize tests (strip / transposed kernels now also for 2D blocks), the
# quantize bench with host time per call, Nsight Compute over the 2D kernels and over every kernel
# one rowwise call launches, the Linear step against PyTorch.
cd "$(dirname "$0")"
rm -rf bin data && tar -xJf bundle.tar.xz
export LOWP_GOLDENS=$PWD/data/goldens LOWP_TEST_DATA=$PWD/data/tests-data LOWP_TEST_DEVICE=cuda
cd ..
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
T0=$(date +%s)
t=$(ls .gpu/bin/test-kernels* | head -1); b=$(ls .gpu/bin/bench-quantize* | head -1); g=$(ls .gpu/bin/bench-gemm* | head -1)
timeout 200 $t --test-threads=1 cuda::quantize_matches_reference cuda::tile_quantize cuda::swizzled cuda::golden cuda::fp8_special cuda::dequantize > $OUT/test-quantize.log 2>&1; echo "tests rc=$? ($(( $(date +%s) - T0 )) s)"
grep -hE "^test |^test result|panicked" $OUT/test-quantize.log | head -20
T1=$(date +%s)
LOWP_BENCH_FILTER=instruction timeout 150 $b --bench > $OUT/quantize.jsonl 2> /tmp/q.err; echo "bench rc=$? ($(( $(date +%s) - T1 )) s)"; tail -2 /tmp/q.err | cut -c1-200
python3 - $OUT/quantize.jsonl <<'PY'
import json,sys
for l in open(sys.argv[1]):
    if not l.startswith('{'): continue
    d=json.loads(l)
    if d['bench']=='copy': print('copy',d['shape'],d['time_us'],d['gbps']); continue
    if d['shape']!=[16384,8192] or d['format'].startswith('nvfp4-'): continue
    print(f"{d['format']:20s} {d.get('kernel','-'):8s} {d['usage']:10s} {d['time_us']:8.1f} us host {d.get('host_us',0):6.1f} us {d['ratio_to_copy']:.3f}")
PY
T2=$(date +%s)
ncu_summary() { python3 - "$1" "$2" <<'PY'
import csv,sys
rows=[r for r in csv.reader(open(sys.argv[1])) if len(r)>10]
hs=[i for i,r in enumerate(rows) if 'Metric Name' in r]
if not hs: print(sys.argv[2],'no rows'); sys.exit()
h=rows[hs[0]]; rows=rows[hs[0]+1:]
want=['Duration','DRAM Throughput','Registers Per Thread','Achieved Occupancy']
iname=h.index('Metric Name'); ival=h.index('Metric Value'); iunit=h.index('Metric Unit'); ik=h.index('Kernel Name'); iid=h.index('ID')
out={}
for r in rows:
    if r[iname] in want: out.setdefault((r[iid],r[ik][:34]),{})[r[iname]]=r[ival]+r[iunit]
for k,v in out.items(): print(sys.argv[2], k, v)
PY
}
if command -v ncu >/dev/null; then
  for spec in "fp8-block-128x128 instruction both|fp8_block_transposed|1" "mxfp8-e4m3-2d instruction both|mxfp8_strip|1" "mxfp8-e4m3-2d instruction rowwise|mxfp8_strip|1" "fp8-e4m3-scale instruction rowwise|.|8" "mxfp8-e4m3 instruction rowwise|.|8" "fp8-block-1x128 instruction rowwise|.|8"; do
    IFS='|' read f k n <<< "$spec"; tag=$(echo "$f" | tr ' ' '-')
    LOWP_BENCH_FILTER="$f" timeout 60 ncu --kernel-name regex:"$k" --launch-skip 40 --launch-count $n --section SpeedOfLight --section Occupancy --section LaunchStats --csv $b --bench > $OUT/ncu-$tag.csv 2>/tmp/ncu.err || { echo "ncu $tag failed"; tail -2 /tmp/ncu.err | cut -c1-200; }
    ncu_summary $OUT/ncu-$tag.csv "$tag"
  done
  echo "ncu ($(( $(date +%s) - T2 )) s)"
fi
T3=$(date +%s)
LOWP_BENCH_FILTER=linear_step timeout 150 $g --bench > $OUT/gemm.jsonl 2>/tmp/g.err; echo "gemm rc=$? ($(( $(date +%s) - T3 )) s)"; tail -2 /tmp/g.err | cut -c1-200
(cd benches && timeout 150 python3 gemm_torch.py --ours $OUT/gemm.jsonl > $OUT/gemm-torch.jsonl 2>/tmp/gt.err); echo "torch gemm rc=$? ($(( $(date +%s) - T3 )) s)"; tail -2 /tmp/gt.err | cut -c1-200
grep -h '"compare": "linear_step"' $OUT/gemm-torch.jsonl
echo "total $(( $(date +%s) - T0 )) s"
