#!/usr/bin/env bash
# Final tree on an H100: CUDA tests; LayerNormMLP passes and steps (rounds, PyTorch in turns);
# Nsight Compute over the gelu step (bf16, current scaling); grouped GEMMs and the GroupedLinear
# step in turns.
cd "$(dirname "$0")"
rm -rf bin data && tar -xJf bundle.tar.xz
cd ..
export LOWP_GOLDENS=$PWD/.gpu/data/goldens LOWP_TEST_DATA=$PWD/.gpu/data/tests-data LOWP_TEST_DEVICE=cuda
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
T0=$(date +%s)
for t in .gpu/bin/test-kernels* .gpu/bin/test-modules*; do
  n=$(basename $t | cut -d- -f1-2)
  echo "=== $n"; timeout 280 "$t" --test-threads=1 > $OUT/$n.log 2>&1; echo "rc=$?"
  grep -hE "^test result|FAILED|panicked" $OUT/$n.log | head -20
done
echo "tests took $(( $(date +%s) - T0 )) s"
B=$(ls .gpu/bin/bench-layernorm_mlp*)
LOWP_BENCH_FILTER=mlp_pass timeout 60 $B --bench > $OUT/mlp-pass.jsonl 2>&1; echo "passes rc=$?"
grep mlp_pass $OUT/mlp-pass.jsonl | cut -c1-160
T1=$(date +%s)
timeout 250 python3 .gpu/layernorm_mlp_torch.py --turns $B > $OUT/mlp-turns.jsonl 2> $OUT/mlp-turns.err; echo "mlp turns rc=$? $(( $(date +%s) - T1 )) s"
tail -2 $OUT/mlp-turns.err
grep -h '"compare"\|"impl"' $OUT/mlp-turns.jsonl | cut -c1-260
NCU=$(which ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
for r in bf16 current_scaling; do
  LOWP_BENCH_FILTER="mlp_step gelu $r" LOWP_STREAM_ORDERING=host-sync timeout 100 $NCU --clock-control none --launch-count 300 --csv --print-units base \
    --metrics gpu__time_duration.sum,launch__grid_size,launch__block_size $B --bench > /tmp/ncu-$r.csv 2>/tmp/ncu-$r.err
  echo "ncu $r rc=$?"; gzip -c /tmp/ncu-$r.csv > $OUT/ncu-mlp-gelu-$r.csv.gz
done
T2=$(date +%s)
timeout 250 python3 .gpu/grouped_torch.py --turns $(ls .gpu/bin/bench-grouped*) > $OUT/grouped-turns.jsonl 2> $OUT/grouped-turns.err; echo "grouped turns rc=$? $(( $(date +%s) - T2 )) s"
tail -2 $OUT/grouped-turns.err
grep -h '"compare"' $OUT/grouped-turns.jsonl | grep grouped_linear_step | python3 -c "
import json,sys
for l in sys.stdin:
  o=json.loads(l); print(o['recipe'], o['dist'], o['ours_us'], o['torch_us'], o['ratio'])"
echo "total $(( $(date +%s) - T0 )) s"
