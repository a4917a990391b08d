#!/usr/bin/env bash
# Call 9: the shipped tree (call 8's norm variant reverted; the kernels of call 3) - the
# LayerNormMLP step in turns with PyTorch, three times in a row, for the spread between runs.
cd "$(dirname "$0")"
rm -rf bin data && tar -xJf bundle.tar.xz
cd ..
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
T0=$(date +%s); el() { echo "$(( $(date +%s) - T0 )) s"; }
bl=$(ls .gpu/bin/bench-layernorm_mlp* | head -1)
for run in 1 2 3; do
  timeout 150 python3 benches/layernorm_mlp_torch.py --turns $bl > $OUT/mlp-turns-$run.jsonl 2> /tmp/mlp.err; echo "mlp turns $run rc=$? $(el)"; tail -1 /tmp/mlp.err
  grep -h '"compare"' $OUT/mlp-turns-$run.jsonl | grep '"current_scaling"\|"bf16"' | cut -c1-300
  grep -h '"impl"' $OUT/mlp-turns-$run.jsonl | grep '"torch_bf16"' | cut -c1-120
done
echo "done $(el)"
