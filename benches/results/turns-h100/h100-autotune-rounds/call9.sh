#!/usr/bin/env bash
# Final tree (autotuner in rounds, load helper) on an H100: CUDA tests; LayerNormMLP steps in
# rounds with PyTorch in turns, twice (two processes, two autotuner runs).
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
for pass in 1 2; do
  T1=$(date +%s)
  LOWP_GEMM_AUTOTUNE_LOG=1 timeout 200 python3 .gpu/layernorm_mlp_torch.py --turns $B > $OUT/mlp-turns-$pass.jsonl 2> $OUT/mlp-turns-$pass.err; echo "mlp turns $pass rc=$? $(( $(date +%s) - T1 )) s"
  grep -h '"compare"' $OUT/mlp-turns-$pass.jsonl | python3 -c "
import json,sys
for l in sys.stdin:
  o=json.loads(l); print(o['activation'], o['recipe'], o['ours_us'], 'ours-bf16', o['speedup_over_our_bf16'], 'torch', o.get('speedup_over_torch_bf16'), 'compile', o.get('speedup_over_torch_compile_bf16'))"
  grep -h '"impl"' $OUT/mlp-turns-$pass.jsonl | cut -c1-200
done
echo "total $(( $(date +%s) - T0 )) s"
