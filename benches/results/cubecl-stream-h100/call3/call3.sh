#!/usr/bin/env bash
# Call 3: grouped GEMMs and the GroupedLinear step against PyTorch in turns; MoE 1.9B with the
# GEMMs on CubeCL's stream against the device-flag handshake (one tuning file per recipe).
source "$(dirname "$0")/common.sh"
T0=$(date +%s)
(cd .. && timeout 330 python3 benches/grouped_torch.py --turns $(ls .gpu/bin/bench-grouped*) > $OUT/grouped-turns.jsonl 2> /tmp/turns.err); echo "grouped turns rc=$? $(( $(date +%s) - T0 )) s"
tail -2 /tmp/turns.err | cut -c1-200
python3 - <<PY
import json
for l in open('$OUT/grouped-turns.jsonl'):
  if not l.startswith('{'): continue
  o=json.loads(l)
  if o.get('bench')!='compare': continue
  print(o['case'][:13], o.get('format') or o.get('recipe'), o.get('gemm'), o['shape'], o['dist'][:4], o.get('batch'), o.get('accumulation'), o['peer'], o['ours_us'], o['torch_us'], o['ratio'])
PY
for r in bf16 delayed_scaling; do
  LOWP_STREAM_ORDERING=device-flags moe moe-1.9b $r 60 1.9b-$r-flags --gemm-tuning /tmp/tune-1.9b-$r.json
  moe moe-1.9b $r 60 1.9b-$r-stream --gemm-tuning /tmp/tune-1.9b-$r.json
done
echo "total $(( $(date +%s) - T0 )) s"
