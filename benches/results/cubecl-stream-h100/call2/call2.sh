#!/usr/bin/env bash
# Call 2: CUDA kernel suite; the LayerNormMLP step against PyTorch in turns (plans on every SM
# now that no wait kernel holds one).
source "$(dirname "$0")/common.sh"
cd ..
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
T0=$(date +%s)
t=$(ls .gpu/bin/test-kernels* | head -1)
timeout 280 $t --test-threads=1 > $OUT/test-kernels.log 2>&1; echo "kernels rc=$? ($(( $(date +%s) - T0 )) s)"
grep -hE "^test result|FAILED|panicked" $OUT/test-kernels.log | head -20
T1=$(date +%s)
timeout 280 python3 benches/layernorm_mlp_torch.py --turns $(ls .gpu/bin/bench-layernorm_mlp*) > $OUT/mlp-turns.jsonl 2> /tmp/mlp-turns.err; echo "mlp turns rc=$? $(( $(date +%s) - T1 )) s"
tail -2 /tmp/mlp-turns.err | cut -c1-200
grep -h '"compare"' $OUT/mlp-turns.jsonl | cut -c1-260
echo "total $(( $(date +%s) - T0 )) s"
