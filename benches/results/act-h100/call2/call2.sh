#!/usr/bin/env bash
# Call 2 (same bundle as call 1): the CUDA source NVRTC compiled for the activation forward kernel
# (does the logistic reach __expf / __fdividef?), and the LayerNormMLP step in turns with PyTorch.
cd "$(dirname "$0")"
[ -d bin ] || { rm -rf bin data && tar -xJf bundle.tar.xz; }
cd ..
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
T0=$(date +%s); el() { echo "$(( $(date +%s) - T0 )) s"; }
bl=$(ls .gpu/bin/bench-layernorm_mlp* | head -1)
which ptxas nvdisasm cuobjdump 2>&1 | head -3
CUBECL_DEBUG_LOG=/tmp/cubecl.log LOWP_BENCH_FILTER="mlp_pass gelu activation_cast_current" timeout 60 $bl --bench > /dev/null 2>&1; echo "log rc=$? $(el)"
ls -la /tmp/cubecl.log; cp /tmp/cubecl.log $OUT/cubecl.log 2>/dev/null
grep -n "__expf\|__fdividef\|__frcp_rn\|expf\|exp(\|tanh" /tmp/cubecl.log | cut -c1-160 | head -20
timeout 300 python3 benches/layernorm_mlp_torch.py --turns $bl > $OUT/mlp-turns.jsonl 2> /tmp/mlp.err; echo "mlp turns rc=$? $(el)"; tail -2 /tmp/mlp.err
grep -h '"compare"' $OUT/mlp-turns.jsonl | cut -c1-330
echo "done $(el)"
