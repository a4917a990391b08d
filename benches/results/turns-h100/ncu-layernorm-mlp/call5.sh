#!/usr/bin/env bash
# Where the LayerNormMLP step's GPU time goes: Nsight Compute over the first 300 launches of the
# gelu step (3 warm-up steps of the first recipe selected), kernels serialized (host-sync ordering).
cd "$(dirname "$0")"
[ -d bin ] || tar -xJf bundle.tar.xz
cd ..
NCU=$(which ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
B=$(ls .gpu/bin/bench-layernorm_mlp*)
for r in bf16 delayed_scaling current_scaling; do
  t0=$(date +%s)
  LOWP_BENCH_FILTER="mlp_step gelu $r" LOWP_STREAM_ORDERING=host-sync timeout 150 $NCU --clock-control none --launch-count 300 --csv --print-units base \
    --metrics gpu__time_duration.sum,launch__grid_size,launch__block_size $B --bench > /tmp/ncu-$r.csv 2>/tmp/ncu-$r.err
  echo "$r ncu rc=$? ($(( $(date +%s) - t0 )) s)"; tail -2 /tmp/ncu-$r.err | cut -c1-200
  python3 .gpu/kernels_by_name.py /tmp/ncu-$r.csv 40 > $OUT/ncu-mlp-gelu-$r.txt 2>&1; head -45 $OUT/ncu-mlp-gelu-$r.txt | cut -c1-170
  gzip -c /tmp/ncu-$r.csv > $OUT/ncu-mlp-gelu-$r.csv.gz
done
