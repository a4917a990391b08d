#!/usr/bin/env bash
# Call 4 (stop 45): MXFP8 / NVFP4 casts without the scale buffers' fill, A/B in turns against the
# previous build (prev), with torch.compile's casts in the same turns; a CUPTI trace of the
# LayerNormMLP gelu step (bf16, current scaling) for the fused kernels' share; then every CUDA
# test of the kernel and module suites, one process a test.
cd "$(dirname "$0")"
rm -rf bin data && tar -xJf bundle.tar.xz && chmod +x prev/bench-quantize-prev
export LOWP_GOLDENS=$PWD/data/goldens LOWP_TEST_DATA=$PWD/data/tests-data LOWP_TEST_DEVICE=cuda
cd ..
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
T0=$(date +%s); el() { echo "$(( $(date +%s) - T0 )) s"; }
bl=$(ls .gpu/bin/bench-layernorm_mlp* | head -1); bq=$(ls .gpu/bin/bench-quantize* | head -1); pq=.gpu/prev/bench-quantize-prev
tk=$(ls .gpu/bin/test-kernels* | head -1); tm=$(ls .gpu/bin/test-modules* | head -1)
for turn in 1 2; do
  for v in prev new; do
    b=$bq; [ $v = prev ] && b=$pq
    for f in "mxfp8-e4m3 instruction rowwise" "mxfp8-e4m3 instruction both" "nvfp4 instruction rowwise" "nvfp4 instruction both"; do
      LOWP_BENCH_FILTER="$f" timeout 60 $b --bench 2>/dev/null | grep '"quantize"' | grep 16384 | grep -v '"tile"' | sed "s/^{/{\"turn\":$turn,\"bin\":\"$v\",/" >> $OUT/quantize.jsonl
    done
  done
  timeout 120 python3 benches/quantize_torch.py --shapes 16384x8192 --formats mxfp8-e4m3 2>/dev/null | grep -E 'compile|copy' | sed "s/^{/{\"turn\":$turn,/" >> $OUT/quantize-torch.jsonl
  echo "quantize turn $turn $(el)"
done
python3 - $OUT <<'PY'
import json, sys
for f in ("quantize.jsonl", "quantize-torch.jsonl"):
    for l in open(f"{sys.argv[1]}/{f}"):
        o = json.loads(l)
        print(o.get("turn"), o.get("bin", o.get("mode", "")), o.get("format"), o.get("usage"), o["time_us"], o.get("ratio_to_copy"))
PY
CI=$(dirname $(find / -name cupti.h -not -path '*/proc/*' 2>/dev/null | head -1)); L=$(find / -name 'libcupti.so*' -not -path '*/proc/*' 2>/dev/null | head -1); CL=$(dirname $L)
CUDAINC=$(dirname $(find / -name cuda.h -path '*include*' -not -path '*/proc/*' 2>/dev/null | head -1))
gcc -O2 -shared -fPIC benches/profile/cupti_trace.c -I$CI -I$CUDAINC -L$CL -l:$(basename $L) -Wl,-rpath,$CL -o /tmp/libcupti_trace.so || echo "no tracer"
for r in "bf16" "current_scaling"; do
  LOWP_BENCH_FILTER="mlp_step gelu $r\$" LOWP_BENCH_PROFILE_STEPS=10 timeout 100 env CUDA_INJECTION64_PATH=/tmp/libcupti_trace.so LOWP_CUPTI_TRACE=/tmp/mlp-$r.csv $bl --bench > /dev/null 2>/tmp/l.err; echo "mlp $r rc=$? $(el)"; tail -1 /tmp/l.err
  python3 benches/profile/cupti_summary.py /tmp/mlp-$r.csv --per 10 --top 24 > /tmp/s.txt 2>&1; echo "##### mlp_step gelu $r" >> $OUT/summaries.txt; cat /tmp/s.txt >> $OUT/summaries.txt; sed -n '/^== segment/,/^idle gaps/p' /tmp/s.txt | head -32
done
$tk --list 2>/dev/null | grep '^cuda::' | sed 's/: test$//' > /tmp/k.txt
$tm --list 2>/dev/null | grep '^cuda::' | sed 's/: test$//' > /tmp/m.txt
( grep -E 'quantize_matches|tile_quantize|activation|swizzle|decoded|stats' /tmp/k.txt | sed 's/^/k /'
  grep -vE 'quantize_matches|tile_quantize|activation|swizzle|decoded|stats' /tmp/k.txt | sed 's/^/k /'
  sed 's/^/m /' /tmp/m.txt ) > /tmp/queue.txt
mkdir -p /tmp/logs
run_one() {
  b=$tk; [ "$1" = m ] && b=$tm
  f=/tmp/logs/$1-${2//::/-}.log
  s=$(date +%s); timeout 400 $b --exact "$2" --test-threads=1 > "$f" 2>&1; rc=$?
  echo "$1 $2 rc=$rc $(( $(date +%s) - s )) s"
}
export -f run_one; export tk tm
xargs -P 12 -L 1 bash -c 'run_one "$@"' _ < /tmp/queue.txt > $OUT/tests-summary.txt
echo "tests done $(el)"
echo "passed: $(grep -c 'rc=0 ' $OUT/tests-summary.txt) of $(wc -l < $OUT/tests-summary.txt)"
grep -v 'rc=0 ' $OUT/tests-summary.txt
for f in $(grep -v 'rc=0 ' $OUT/tests-summary.txt | awk '{print $1"-"$2}' | sed 's/::/-/g'); do grep -E "panicked|differ" /tmp/logs/$f.log | head -3; done
cd /tmp && tar -cJf $OUT/logs.tar.xz logs && tar -cJf $OUT/traces.tar.xz mlp-*.csv 2>/dev/null
echo "done $(el)"
