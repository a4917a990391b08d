#!/usr/bin/env bash
# Call 4 (final tree): the LayerNormMLP step in turns with PyTorch, the Linear step and its
# PyTorch peer, and CUPTI traces of MoE example steps (235M and 1.9B, bf16 and current scaling).
cd "$(dirname "$0")"
[ -d bin ] || { rm -rf bin data && tar -xJf bundle.tar.xz; }
cd ..
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
T0=$(date +%s); el() { echo "$(( $(date +%s) - T0 )) s"; }
bg=$(ls .gpu/bin/bench-gemm* | head -1); bl=$(ls .gpu/bin/bench-layernorm_mlp* | head -1); moe=$(ls .gpu/bin/example-moe_train* | head -1)
timeout 250 python3 benches/layernorm_mlp_torch.py --turns $bl > $OUT/mlp-turns.jsonl 2> /tmp/mlp.err; echo "mlp turns rc=$? $(el)"; tail -2 /tmp/mlp.err
grep -h '"compare"' $OUT/mlp-turns.jsonl | cut -c1-250
LOWP_BENCH_FILTER=linear_step timeout 60 $bg --bench > $OUT/linear.jsonl 2>/dev/null; echo "linear $(el)"
timeout 120 python3 benches/gemm_torch.py --ours $OUT/linear.jsonl > $OUT/gemm-torch.jsonl 2>/dev/null; echo "torch gemm $(el)"
grep -h linear_step $OUT/linear.jsonl $OUT/gemm-torch.jsonl | cut -c1-200
CI=$(dirname $(find / -name cupti.h -not -path '*/proc/*' 2>/dev/null | head -1)); L=$(find / -name 'libcupti.so*' -not -path '*/proc/*' 2>/dev/null | head -1); CL=$(dirname $L)
CUDAINC=$(dirname $(find / -name cuda.h -path '*include*' -not -path '*/proc/*' 2>/dev/null | head -1))
gcc -O2 -shared -fPIC benches/profile/cupti_trace.c -I$CI -I$CUDAINC -L$CL -l:$(basename $L) -Wl,-rpath,$CL -o /tmp/libcupti_trace.so || exit 1
for spec in "moe-235m bf16 30" "moe-235m current_scaling 30" "moe-1.9b bf16 12" "moe-1.9b current_scaling 12"; do
  read cfg r steps <<< "$spec"
  timeout 100 env CUDA_INJECTION64_PATH=/tmp/libcupti_trace.so LOWP_CUPTI_TRACE=/tmp/moe-$cfg-$r.csv $moe --config configs/$cfg.json --recipe recipes/$r.json --steps $steps --quiet --no-checkpoint --out /tmp/runs/$cfg > /tmp/moe.log 2>&1; echo "moe $cfg $r rc=$? $(el)"; tail -2 /tmp/moe.log | cut -c1-200
  python3 -c "import json,glob; s=json.load(open(glob.glob('/tmp/runs/$cfg/$r/summary.json')[0])); print('step_ms', round(s['step_ms'],1), 'loss', round(s['final_loss'],4))" 2>/dev/null
  python3 benches/profile/cupti_summary.py /tmp/moe-$cfg-$r.csv --split-ms 20 --top 8 > /tmp/s.txt 2>&1; echo "##### $spec" >> $OUT/moe-traces.txt; cat /tmp/s.txt >> $OUT/moe-traces.txt; sed -n '/== segment/,/^GPU time/p' /tmp/s.txt; grep -A6 "idle gaps per" /tmp/s.txt
done
cd /tmp && tar -cJf $OUT/moe-traces.tar.xz moe-*.csv; ls -la $OUT
echo "done $(el)"
