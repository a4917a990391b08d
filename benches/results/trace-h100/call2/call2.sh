#!/usr/bin/env bash
# Trace call 2 (exploratory): tile order A/B (last tile first, the new default, against first tile
# first) and event timing against the wall clock, on the quantize bench, the Linear step and the
# LayerNormMLP gelu step; CUPTI traces of the gelu current-scaling step in both orders.
cd "$(dirname "$0")"
rm -rf bin data && tar -xJf bundle.tar.xz
cd ..
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
T0=$(date +%s)
CI=$(dirname $(find / -name cupti.h -not -path '*/proc/*' 2>/dev/null | head -1)); L=$(find / -name 'libcupti.so*' -not -path '*/proc/*' 2>/dev/null | head -1); CL=$(dirname $L)
CUDAINC=$(dirname $(find / -name cuda.h -path '*include*' -not -path '*/proc/*' 2>/dev/null | head -1))
gcc -O2 -shared -fPIC benches/profile/cupti_trace.c -I$CI -I$CUDAINC -L$CL -l:$(basename $L) -Wl,-rpath,$CL -o /tmp/libcupti_trace.so || exit 1
bq=$(ls .gpu/bin/bench-quantize* | head -1); bg=$(ls .gpu/bin/bench-gemm* | head -1); bl=$(ls .gpu/bin/bench-layernorm_mlp* | head -1)
el() { echo "$(( $(date +%s) - T0 )) s"; }
for order in last first; do
  LOWP_BENCH_TILE_ORDER=$order LOWP_BENCH_FILTER=instruction timeout 100 $bq --bench 2>/dev/null | sed "s/^{/{\"order\":\"$order\",\"clock\":\"events\",/" >> $OUT/quantize.jsonl; echo "quantize $order $(el)"
done
LOWP_BENCH_CLOCK=wall LOWP_BENCH_FILTER="instruction rowwise" timeout 60 $bq --bench 2>/dev/null | sed "s/^{/{\"order\":\"last\",\"clock\":\"wall\",/" >> $OUT/quantize.jsonl; echo "quantize wall $(el)"
timeout 70 python3 benches/quantize_torch.py --formats fp8-e4m3-current,fp8-e4m3-scale,fp8-block-1x128,mxfp8-e4m3,nvfp4 > $OUT/quantize-torch.jsonl 2>/dev/null; echo "torch quantize $(el)"
for order in last first; do
  LOWP_BENCH_TILE_ORDER=$order LOWP_BENCH_FILTER="linear_step" timeout 60 $bg --bench 2>/dev/null | sed "s/^{/{\"order\":\"$order\",/" >> $OUT/steps.jsonl; echo "linear $order $(el)"
done
for order in last first; do
  LOWP_BENCH_TILE_ORDER=$order LOWP_BENCH_FILTER="mlp_step gelu" timeout 100 $bl --bench 2>/dev/null | sed "s/^{/{\"order\":\"$order\",/" >> $OUT/steps.jsonl; echo "mlp $order $(el)"
done
for order in last first; do
  LOWP_BENCH_TILE_ORDER=$order LOWP_BENCH_FILTER="mlp_step gelu current_scaling\$" LOWP_BENCH_PROFILE_STEPS=10 timeout 60 env CUDA_INJECTION64_PATH=/tmp/libcupti_trace.so LOWP_CUPTI_TRACE=/tmp/mlp-cur-$order.csv $bl --bench > /dev/null 2>&1; echo "trace mlp $order $(el)"
done
: > $OUT/ncu.csv
for k in activation_forward activation_backward; do
  echo "### $k" >> $OUT/ncu.csv
  LOWP_BENCH_FILTER="mlp_pass gelu $k" timeout 60 ncu --clock-control none --kernel-name regex:"$k" --launch-skip 3 --launch-count 1 --section SpeedOfLight --section Occupancy --section LaunchStats --section MemoryWorkloadAnalysis --section WarpStateStats --csv $bl --bench 2>/dev/null | grep -v '^{' >> $OUT/ncu.csv; echo "ncu $k $(el)"
done
cd /tmp && tar -cJf $OUT/traces.tar.xz mlp-cur-*.csv
python3 - $OUT/quantize.jsonl $OUT/quantize-torch.jsonl $OUT/steps.jsonl <<'PY'
import json,sys
q=[json.loads(l) for l in open(sys.argv[1]) if l.startswith('{')]
t=[json.loads(l) for l in open(sys.argv[2]) if l.startswith('{')]
comp={(d['format'],d['usage'],tuple(d['shape'])):d['time_us'] for d in t if d.get('mode')=='compile'}
tc={tuple(d['shape']):d['time_us'] for d in t if d['bench']=='torch-copy'}
rows={}
for d in q:
    if d['bench']!='quantize' or d.get('kernel','launcher')!='launcher': continue
    rows.setdefault((d['format'],d['usage'],tuple(d['shape'])),{})[(d['order'],d['clock'])]=d['time_us']
for k,v in sorted(rows.items()):
    print(f"{k[0]:18s} {k[1]:10s} {str(k[2]):14s} last {v.get(('last','events'),0):7.1f} first {v.get(('first','events'),0):7.1f} wall {v.get(('last','wall'),0):7.1f} compile {comp.get(k,'-')} torchcopy {tc.get(k[2],'-')}")
for l in open(sys.argv[3]):
    if l.startswith('{'):
        d=json.loads(l); print(d.get('order'),d.get('bench'),d.get('activation',''),d.get('recipe'),d.get('time_us'))
PY
echo "done $(el)"
