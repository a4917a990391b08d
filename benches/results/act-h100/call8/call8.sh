#!/usr/bin/env bash
# Call 8: the norm kernels with NORM_STEP loads ahead (same summation order). CUDA norm and fused
# tests, the passes alone, the LayerNormMLP step in turns with PyTorch, and a CUPTI trace of the
# gelu current-scaling step.
cd "$(dirname "$0")"
rm -rf bin data && tar -xJf bundle.tar.xz
export LOWP_GOLDENS=$PWD/data/goldens LOWP_TEST_DATA=$PWD/data/tests-data LOWP_TEST_DEVICE=cuda
cd ..
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
T0=$(date +%s); el() { echo "$(( $(date +%s) - T0 )) s"; }
tk=$(ls .gpu/bin/test-kernels* | head -1); bl=$(ls .gpu/bin/bench-layernorm_mlp* | head -1)
timeout 150 $tk --test-threads=4 cuda::norm cuda::fused::fused_rms_norm > $OUT/test-kernels.log 2>&1; echo "kernels rc=$? $(el)"
grep -hE "^test |^test result|FAILED|panicked" $OUT/test-kernels.log | grep -v "running for" | head -10
LOWP_BENCH_FILTER=mlp_pass timeout 100 $bl --bench > $OUT/passes.jsonl 2>/tmp/p.err; echo "passes rc=$? $(el)"; tail -1 /tmp/p.err
cut -c1-200 $OUT/passes.jsonl
timeout 200 python3 benches/layernorm_mlp_torch.py --turns $bl > $OUT/mlp-turns.jsonl 2> /tmp/mlp.err; echo "mlp turns rc=$? $(el)"; tail -2 /tmp/mlp.err
grep -h '"compare"' $OUT/mlp-turns.jsonl | cut -c1-330
grep -h '"impl"' $OUT/mlp-turns.jsonl | cut -c1-200
CI=$(dirname $(find / -name cupti.h -not -path '*/proc/*' 2>/dev/null | head -1)); L=$(find / -name 'libcupti.so*' -not -path '*/proc/*' 2>/dev/null | head -1); CL=$(dirname $L)
CUDAINC=$(dirname $(find / -name cuda.h -path '*include*' -not -path '*/proc/*' 2>/dev/null | head -1))
gcc -O2 -shared -fPIC benches/profile/cupti_trace.c -I$CI -I$CUDAINC -L$CL -l:$(basename $L) -Wl,-rpath,$CL -o /tmp/libcupti_trace.so || exit 1
LOWP_BENCH_FILTER='mlp_step gelu current_scaling$' LOWP_BENCH_PROFILE_STEPS=10 timeout 100 env CUDA_INJECTION64_PATH=/tmp/libcupti_trace.so LOWP_CUPTI_TRACE=/tmp/mlp-cs.csv $bl --bench > /dev/null 2>/tmp/l.err; echo "trace rc=$? $(el)"
python3 benches/profile/cupti_summary.py /tmp/mlp-cs.csv --per 10 --top 16 > $OUT/summary.txt 2>&1; sed -n '/^== segment/,/^idle gaps/p' $OUT/summary.txt | tail -20
echo "done $(el)"
