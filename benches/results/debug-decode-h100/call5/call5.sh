#!/usr/bin/env bash
# The tree with plane-shuffle reductions in the statistics kernels: CUDA kernel and module
# suites in full; Nsight Compute of the statistics kernels over the first 12 steps of a debugged
# 235M run; then MoE 235M and 1.9B current scaling, each with one GEMM tuning file made by a
# plain run first (so every run of a model computes the same GEMMs and the losses must agree),
# configs/debug/moe.json, the session's start (old) and this tree (new) alternating.
rm -rf "$(dirname "$0")/bin"
source "$(dirname "$0")/common.sh"
cd ..
export LOWP_GOLDENS=$PWD/.gpu/data/goldens LOWP_TEST_DATA=$PWD/.gpu/data/tests-data LOWP_TEST_DEVICE=cuda
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
T0=$(date +%s)
for t in .gpu/bin/test-kernels* .gpu/bin/test-modules*; do
  n=$(basename $t | cut -d- -f1-2)
  echo "=== $n"; timeout 280 "$t" --test-threads=1 > $OUT/$n.log 2>&1; echo "rc=$?"
  grep -hE "^test result|FAILED|panicked" $OUT/$n.log | head -20
  grep -h "plane_trees" $OUT/$n.log
done
echo "tests took $(( $(date +%s) - T0 )) s"
cd .gpu
D="--debug-config ../configs/debug/moe.json"
NCU=$(which ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
t0=$(date +%s)
LOWP_STREAM_ORDERING=host-sync timeout 150 $NCU --clock-control none --kernel-name regex:stats --launch-count 1000 --csv --print-units base \
  --metrics gpu__time_duration.sum,launch__grid_size,launch__block_size \
  bin/moe_train --config ../configs/moe-235m.json --recipe ../recipes/current_scaling.json --data /tmp/corpus.txt --steps 12 --quiet --no-checkpoint $D --out /tmp/ncu-runs/dbg > /tmp/ncu-dbg.csv 2>/tmp/ncu-dbg.err
echo "ncu rc=$? ($(( $(date +%s) - t0 )) s)"; tail -2 /tmp/ncu-dbg.err | cut -c1-200
python3 ../benches/profile/kernels_by_name.py /tmp/ncu-dbg.csv 10 > $OUT/ncu-stats.txt 2>&1; cut -c1-200 $OUT/ncu-stats.txt
T1="--gemm-tuning /tmp/tune-235m.json"
moe moe_train moe-235m current_scaling 150 235m-plain $T1
for pass in 1 2; do
  moe moe_train_old moe-235m current_scaling 150 235m-old-$pass $D $T1
  moe moe_train moe-235m current_scaling 150 235m-new-$pass $D $T1
done
T2="--gemm-tuning /tmp/tune-1.9b.json"
moe moe_train moe-1.9b current_scaling 100 1.9b-plain $T2
moe moe_train_old moe-1.9b current_scaling 100 1.9b-old $D $T2
moe moe_train moe-1.9b current_scaling 100 1.9b-new $D $T2
grep -h "debug cost" /tmp/runs-*.log | cut -c1-250
echo "total $(( $(date +%s) - T0 )) s"
