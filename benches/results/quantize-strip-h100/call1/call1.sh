#!/usr/bin/env bash
# Quantize call 1: CUDA quantize tests (new columnwise kernels, the tile kernels forced), our
# quantize bench (launcher's kernel and the tile kernel it replaced, same process), Nsight Compute
# over the new kernels, PyTorch's peer (eager + compile) on the large shape.
cd "$(dirname "$0")"
rm -rf bin data && tar -xJf bundle.tar.xz
export LOWP_GOLDENS=$PWD/data/goldens LOWP_TEST_DATA=$PWD/data/tests-data LOWP_TEST_DEVICE=cuda
cd ..
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
T0=$(date +%s)
t=$(ls .gpu/bin/test-kernels* | head -1); b=$(ls .gpu/bin/bench-quantize* | head -1)
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
    print(f"{d['format']:20s} {d.get('kernel','-'):8s} {d['usage']:10s} {str(d['shape']):14s} {d['time_us']:8.1f} us {d['ratio_to_copy']:.3f}")
PY
T2=$(date +%s)
if command -v ncu >/dev/null; then
  for spec in "mxfp8-e4m3 instruction columnwise|mxfp8_columnwise" "mxfp8-e4m3 instruction columnwise|mxfp8_kernel" "mxfp8-e4m3 instruction both|mxfp8_columnwise" "fp8-block-1x128 instruction columnwise|fp8_block_transposed" "fp8-block-1x128 instruction both|fp8_block_transposed"; do
    f=${spec%%|*}; k=${spec##*|}; tag=$(echo "$f-$k" | tr ' ' '-')
    LOWP_BENCH_FILTER="$f" timeout 60 ncu --kernel-name regex:"$k" --launch-count 1 --section SpeedOfLight --section Occupancy --section LaunchStats --section MemoryWorkloadAnalysis --csv $b --bench > $OUT/ncu-$tag.csv 2>/tmp/ncu.err || { echo "ncu $tag failed"; tail -2 /tmp/ncu.err | cut -c1-200; }
    python3 - $OUT/ncu-$tag.csv "$tag" <<'PY'
import csv,sys
rows=[r for r in csv.reader(open(sys.argv[1])) if len(r)>10]
if not rows: print(sys.argv[2],'no rows'); sys.exit()
h=rows[0]; want=['Duration','DRAM Throughput','Memory Throughput','Compute (SM) Throughput','Registers Per Thread','Achieved Occupancy','Theoretical Occupancy','L1/TEX Hit Rate','L2 Hit Rate']
iname=h.index('Metric Name'); ival=h.index('Metric Value'); iunit=h.index('Metric Unit'); ik=h.index('Kernel Name')
out={}
for r in rows[1:]:
    if r[iname] in want: out[r[iname]]=r[ival]+r[iunit]
print(sys.argv[2], rows[1][ik][:40], out)
PY
  done
  echo "ncu ($(( $(date +%s) - T2 )) s)"
fi
T3=$(date +%s)
timeout 240 python3 benches/quantize_torch.py --shapes 16384x8192 > $OUT/quantize-torch.jsonl 2>/tmp/qt.err; echo "torch rc=$? ($(( $(date +%s) - T3 )) s)"; tail -2 /tmp/qt.err | cut -c1-200
grep -h "torch-copy" $OUT/quantize-torch.jsonl
echo "total $(( $(date +%s) - T0 )) s"
