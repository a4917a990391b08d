#!/usr/bin/env bash
# Trace call 1: build the CUPTI tracer, trace the one-pass rowwise casts (ours and torch.compile's),
# the Linear step and the LayerNormMLP gelu step (bf16 and current scaling), and summarize each.
cd "$(dirname "$0")"
rm -rf bin data && tar -xJf bundle.tar.xz
export LOWP_GOLDENS=$PWD/data/goldens LOWP_TEST_DATA=$PWD/data/tests-data LOWP_TEST_DEVICE=cuda
cd ..
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
T0=$(date +%s)
H=$(find / -name cupti.h -not -path '*/proc/*' 2>/dev/null | head -3); echo "cupti.h: $H"
L=$(find / -name 'libcupti.so*' -not -path '*/proc/*' 2>/dev/null | head -3); echo "libcupti: $L"
CI=$(dirname $(echo "$H" | head -1)); CL=$(dirname $(echo "$L" | head -1))
CUDAINC=$(dirname $(find / -name cuda.h -path '*include*' -not -path '*/proc/*' 2>/dev/null | head -1))
grep -ho "CUpti_ActivityKernel[0-9]*\b\|CUpti_ActivityMemcpy[0-9]*\b\|CUpti_ActivityMemset[0-9]*\b" $CI/cupti_activity.h | sort -u | tr '\n' ' '; echo
gcc -O2 -shared -fPIC benches/profile/cupti_trace.c -I$CI -I$CUDAINC -L$CL -l:$(basename $(echo "$L" | head -1)) -Wl,-rpath,$CL -o /tmp/libcupti_trace.so 2>&1 | head -20
ls -la /tmp/libcupti_trace.so || exit 1
tr() { CUDA_INJECTION64_PATH=/tmp/libcupti_trace.so LOWP_CUPTI_TRACE=$1 "${@:2}"; }
bq=$(ls .gpu/bin/bench-quantize* | head -1); bg=$(ls .gpu/bin/bench-gemm* | head -1); bl=$(ls .gpu/bin/bench-layernorm_mlp* | head -1)
for f in "fp8-e4m3-scale instruction rowwise" "mxfp8-e4m3 instruction rowwise" "fp8-block-1x128 instruction rowwise" "fp8-e4m3-current instruction rowwise"; do
  n=$(echo $f | cut -d' ' -f1)
  LOWP_BENCH_FILTER="$f" timeout 60 env CUDA_INJECTION64_PATH=/tmp/libcupti_trace.so LOWP_CUPTI_TRACE=/tmp/q-$n.csv $bq --bench > /tmp/q-$n.jsonl 2>/tmp/q.err; echo "$f rc=$? ($(( $(date +%s) - T0 )) s)"; tail -1 /tmp/q.err
  grep -h '"quantize"' /tmp/q-$n.jsonl | head -2 | cut -c1-220; cat /tmp/q-$n.jsonl >> $OUT/bench.jsonl
  python3 benches/profile/cupti_summary.py /tmp/q-$n.csv --per 20 --top 6 > /tmp/s.txt 2>&1; echo "##### quantize $f" >> $OUT/summaries.txt; cat /tmp/s.txt >> $OUT/summaries.txt; head -16 /tmp/s.txt
done
timeout 90 env CUDA_INJECTION64_PATH=/tmp/libcupti_trace.so LOWP_CUPTI_TRACE=/tmp/q-torch.csv python3 benches/quantize_torch.py --shapes 16384x8192 --formats fp8-e4m3-scale,mxfp8-e4m3 > /tmp/q-torch.jsonl 2>/tmp/qt.err; echo "torch rc=$? ($(( $(date +%s) - T0 )) s)"; tail -1 /tmp/qt.err
cat /tmp/q-torch.jsonl | cut -c1-200 | head -12; cat /tmp/q-torch.jsonl >> $OUT/bench.jsonl
python3 benches/profile/cupti_summary.py /tmp/q-torch.csv --top 4 > /tmp/s.txt 2>&1; echo "##### quantize torch" >> $OUT/summaries.txt; cat /tmp/s.txt >> $OUT/summaries.txt; head -25 /tmp/s.txt
for r in "bf16" "current_scaling"; do
  LOWP_BENCH_FILTER="linear_step $r\$" LOWP_BENCH_PROFILE_STEPS=20 timeout 90 env CUDA_INJECTION64_PATH=/tmp/libcupti_trace.so LOWP_CUPTI_TRACE=/tmp/lin-$r.csv $bg --bench > /dev/null 2>/tmp/g.err; echo "linear $r rc=$? ($(( $(date +%s) - T0 )) s)"; tail -1 /tmp/g.err
  python3 benches/profile/cupti_summary.py /tmp/lin-$r.csv --per 20 --top 10 > /tmp/s.txt 2>&1; echo "##### linear_step $r" >> $OUT/summaries.txt; cat /tmp/s.txt >> $OUT/summaries.txt; head -30 /tmp/s.txt
done
for r in "bf16" "current_scaling"; do
  LOWP_BENCH_FILTER="mlp_step gelu $r\$" LOWP_BENCH_PROFILE_STEPS=10 timeout 120 env CUDA_INJECTION64_PATH=/tmp/libcupti_trace.so LOWP_CUPTI_TRACE=/tmp/mlp-$r.csv $bl --bench > /dev/null 2>/tmp/l.err; echo "mlp $r rc=$? ($(( $(date +%s) - T0 )) s)"; tail -1 /tmp/l.err
  python3 benches/profile/cupti_summary.py /tmp/mlp-$r.csv --per 10 --top 10 > /tmp/s.txt 2>&1; echo "##### mlp_step gelu $r" >> $OUT/summaries.txt; cat /tmp/s.txt >> $OUT/summaries.txt; head -30 /tmp/s.txt
done
cd /tmp && tar -cJf $OUT/traces.tar.xz q-*.csv lin-*.csv mlp-*.csv 2>/dev/null; ls -la $OUT
