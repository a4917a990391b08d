#!/usr/bin/env bash
# Call 3 (final tree): the CUDA quantize kernel tests the amax change touches; the quantize bench
# timed with events (and once with the wall clock), PyTorch's peer in the same call.
cd "$(dirname "$0")"
rm -rf bin data && tar -xJf bundle.tar.xz
export LOWP_GOLDENS=$PWD/data/goldens LOWP_TEST_DATA=$PWD/data/tests-data LOWP_TEST_DEVICE=cuda
cd ..
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
T0=$(date +%s); el() { echo "$(( $(date +%s) - T0 )) s"; }
tk=$(ls .gpu/bin/test-kernels* | head -1); bq=$(ls .gpu/bin/bench-quantize* | head -1)
timeout 290 $tk --test-threads=8 cuda::quantize_matches_reference cuda::golden cuda::nvfp4_special cuda::fp8_special cuda::grouped_quantize cuda::tile_quantize > $OUT/test-kernels.log 2>&1; echo "kernels rc=$? $(el)"
grep -hE "^test |^test result|FAILED|panicked" $OUT/test-kernels.log | head -20
LOWP_BENCH_FILTER=instruction timeout 60 $bq --bench 2>/dev/null | sed 's/^{/{"clock":"events",/' > $OUT/quantize.jsonl; echo "quantize $(el)"
LOWP_BENCH_CLOCK=wall LOWP_BENCH_FILTER="instruction rowwise" timeout 40 $bq --bench 2>/dev/null | sed 's/^{/{"clock":"wall",/' >> $OUT/quantize.jsonl; echo "quantize wall $(el)"
timeout 100 python3 benches/quantize_torch.py > $OUT/quantize-torch.jsonl 2>/dev/null; echo "torch quantize $(el)"
python3 - $OUT/quantize.jsonl $OUT/quantize-torch.jsonl <<'PY'
import json,sys
q=[json.loads(l) for l in open(sys.argv[1]) if l.startswith('{')]
t=[json.loads(l) for l in open(sys.argv[2]) if l.startswith('{')]
comp={(d['format'],d['usage'],tuple(d['shape'])):d['time_us'] for d in t if d.get('mode')=='compile'}
tc={tuple(d['shape']):d['time_us'] for d in t if d['bench']=='torch-copy'}
oc={(tuple(d['shape']),d['clock']):d['time_us'] for d in q if d['bench']=='copy'}
print('copy', tc, oc)
rows={}
for d in q:
    if d['bench']!='quantize': continue
    rows.setdefault((d['format'],d['usage'],tuple(d['shape'])),{})[(d.get('kernel','launcher'),d['clock'])]=(d['time_us'],d['gbps'])
for k,v in sorted(rows.items()):
    ev=v.get(('launcher','events'),(0,0)); wl=v.get(('launcher','wall'),(0,0)); tile=v.get(('tile','events'),(0,0))
    ratio=ev[1]/(4*k[2][0]*k[2][1]/tc[k[2]]/1e3) if ev[0] else 0
    c=comp.get(k)
    print(f"{k[0]:18s} {k[1]:10s} {str(k[2]):14s} events {ev[0]:7.1f} (/torchcopy {ratio:.3f}) wall {wl[0]:7.1f} tile {tile[0]:7.1f} compile {c if c else '-'} {'' if not c else f'ours/compile {c/ev[0]:.3f}'}")
PY
echo "done $(el)"
