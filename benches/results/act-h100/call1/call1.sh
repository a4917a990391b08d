#!/usr/bin/env bash
# Call 1: the 16-byte activation kernels with the logistic on the exponential and reciprocal units,
# and FP8 current scaling's fused activation cast. CUDA tests of the norm/activation kernels and
# the LayerNormMLP module; the passes alone (fused cast against the activation + cast it replaces);
# CUPTI traces of the gelu step (bf16, current and delayed scaling).
cd "$(dirname "$0")"
rm -rf bin data && tar -xJf bundle.tar.xz
export LOWP_GOLDENS=$PWD/data/goldens LOWP_TEST_DATA=$PWD/data/tests-data LOWP_TEST_DEVICE=cuda
cd ..
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
T0=$(date +%s); el() { echo "$(( $(date +%s) - T0 )) s"; }
tk=$(ls .gpu/bin/test-kernels* | head -1); tm=$(ls .gpu/bin/test-modules* | head -1); bl=$(ls .gpu/bin/bench-layernorm_mlp* | head -1)
timeout 200 $tk --test-threads=4 cuda::activation cuda::norm > $OUT/test-kernels.log 2>&1; echo "kernels rc=$? $(el)"
grep -hE "^test |^test result|FAILED|panicked" $OUT/test-kernels.log | head -20
timeout 150 $tm --test-threads=4 cuda::layernorm_mlp cuda::a_stack_of_layernorm cuda::bad_layernorm > $OUT/test-modules.log 2>&1; echo "modules rc=$? $(el)"
grep -hE "^test |^test result|FAILED|panicked" $OUT/test-modules.log | head -20
LOWP_BENCH_FILTER=mlp_pass timeout 100 $bl --bench > $OUT/passes.jsonl 2>/tmp/p.err; echo "passes rc=$? $(el)"; tail -1 /tmp/p.err
cut -c1-200 $OUT/passes.jsonl
CI=$(dirname $(find / -name cupti.h -not -path '*/proc/*' 2>/dev/null | head -1)); L=$(find / -name 'libcupti.so*' -not -path '*/proc/*' 2>/dev/null | head -1); CL=$(dirname $L)
CUDAINC=$(dirname $(find / -name cuda.h -path '*include*' -not -path '*/proc/*' 2>/dev/null | head -1))
gcc -O2 -shared -fPIC benches/profile/cupti_trace.c -I$CI -I$CUDAINC -L$CL -l:$(basename $L) -Wl,-rpath,$CL -o /tmp/libcupti_trace.so || exit 1
for r in "bf16" "current_scaling" "delayed_scaling"; do
  LOWP_BENCH_FILTER="mlp_step gelu $r\$" LOWP_BENCH_PROFILE_STEPS=10 timeout 100 env CUDA_INJECTION64_PATH=/tmp/libcupti_trace.so LOWP_CUPTI_TRACE=/tmp/mlp-$r.csv $bl --bench > /dev/null 2>/tmp/l.err; echo "mlp $r rc=$? $(el)"; tail -1 /tmp/l.err
  python3 benches/profile/cupti_summary.py /tmp/mlp-$r.csv --per 10 --top 14 > /tmp/s.txt 2>&1; echo "##### mlp_step gelu $r" >> $OUT/summaries.txt; cat /tmp/s.txt >> $OUT/summaries.txt; sed -n '/^== segment/,/^idle gaps/p' /tmp/s.txt | tail -20
done
cd /tmp && tar -cJf $OUT/traces.tar.xz mlp-*.csv 2>/dev/null; ls -la $OUT
echo "done $(el)"
