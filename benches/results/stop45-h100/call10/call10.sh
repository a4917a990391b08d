#!/usr/bin/env bash
# Call 10 (stop 45): the PyTorch peers after their timed run became torch_timing.one_run: the
# LayerNormMLP step in turns (bench binary of this stop's kernels) and the Linear step in turns.
cd "$(dirname "$0")"
rm -rf bin data && tar -xJf bundle.tar.xz && chmod +x extra/*
cd ..
T0=$(date +%s); el() { echo "$(( $(date +%s) - T0 )) s"; }
bg=$(ls .gpu/bin/bench-gemm* | head -1); bl=.gpu/extra/bench-layernorm_mlp
timeout 150 python3 benches/layernorm_mlp_torch.py --turns $bl > $OUT/mlp-turns.jsonl 2> /tmp/mlp.err; echo "mlp turns rc=$? $(el)"; tail -1 /tmp/mlp.err
grep -h '"compare"' $OUT/mlp-turns.jsonl | grep -E '"(bf16|current_scaling|delayed_scaling)"' | cut -c1-260
LOWP_BENCH_FILTER=linear_step timeout 150 python3 benches/gemm_torch.py --turns $bg > $OUT/linear-turns.jsonl 2>/tmp/t.err; echo "linear turns rc=$? $(el)"; tail -1 /tmp/t.err
grep -h '"compare"' $OUT/linear-turns.jsonl | cut -c1-200
echo "done $(el)"
