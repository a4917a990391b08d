#!/usr/bin/env bash
# Call F: where the 1.9B step's GPU time goes. Nsight Compute over about one step (1500 launches
# after 15000, i.e. after ~11 steps), kernels serialized (LOWP_STREAM_ORDERING=host-sync so that ncu
# can), bf16 and delayed scaling; summed by kernel name (benches/profile/kernels_by_name.py).
source "$(dirname "$0")/common.sh"
T0=$(date +%s)
which ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null
NCU=$(which ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
for r in bf16 delayed_scaling; do
  t0=$(date +%s)
  LOWP_STREAM_ORDERING=host-sync timeout 250 $NCU --clock-control none --launch-skip 15000 --launch-count 1500 --csv --print-units base \
    --metrics gpu__time_duration.sum,launch__grid_size,launch__block_size \
    bin/moe_train --config ../configs/moe-1.9b.json --recipe ../recipes/$r.json --data /tmp/corpus.txt --steps 14 --quiet --no-checkpoint --out /tmp/ncu-runs/$r > /tmp/ncu-$r.csv 2>/tmp/ncu-$r.err
  echo "$r ncu rc=$? ($(( $(date +%s) - t0 )) s)"; tail -2 /tmp/ncu-$r.err | cut -c1-200
  python3 kernels_by_name.py /tmp/ncu-$r.csv 45 > $OUT/ncu-1.9b-$r.txt 2>&1; head -50 $OUT/ncu-1.9b-$r.txt | cut -c1-180
  grep -c "rope_kernel" /tmp/ncu-$r.csv
done
echo "total $(( $(date +%s) - T0 )) s"
