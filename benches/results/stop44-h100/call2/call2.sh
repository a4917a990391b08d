#!/usr/bin/env bash
# Call 2 (stop 44, the bundle of call 1): the kernel tests call 1's 430 s did not reach (the
# quantize, tile, grouped and activation suites), the CUDA module suite, and an A/B of the base
# tree's quantize bench (old/) against this tree's in turns for the FP8 per-tensor casts.
# (In call 1's tree the transposed cast also served the columnwise copy alone.)
cd "$(dirname "$0")"
[ -d bin ] || { tar -xJf bundle.tar.xz && mkdir -p old && tar -xJf old.tar.xz -C old; }
export LOWP_GOLDENS=$PWD/data/goldens LOWP_TEST_DATA=$PWD/data/tests-data LOWP_TEST_DEVICE=cuda
cd ..
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
T0=$(date +%s); el() { echo "$(( $(date +%s) - T0 )) s"; }
tk=$(ls .gpu/bin/test-kernels* | head -1); tm=$(ls .gpu/bin/test-modules* | head -1)
timeout 340 $tk --test-threads=10 cuda::activation_fused cuda::activations_match cuda::decoded_quantization cuda::grouped_quantize cuda::padded_fp8 cuda::quantize_matches cuda::swizzled cuda::tile_quantize cuda::zeroed > $OUT/test-kernels-rest.log 2>&1; echo "kernels rc=$? $(el)"
grep -hE "^test .*(ok|FAILED)$|^test result|panicked" $OUT/test-kernels-rest.log | head -14
timeout 120 $tm --test-threads=4 cuda:: > $OUT/test-modules.log 2>&1; echo "modules rc=$? $(el)"
grep -hE "^test result|FAILED|panicked" $OUT/test-modules.log | head -10
declare -A bq; bq[new]=$(ls .gpu/bin/bench-quantize* | head -1); bq[old]=.gpu/old/bench-quantize-old
tag() { sed "s/^{/{\"bin\":\"$1\",/"; }
for v in old new old new; do
  for f in "fp8-e4m3-scale instruction" "fp8-e4m3-current instruction"; do
    LOWP_BENCH_FILTER="$f" timeout 40 ${bq[$v]} --bench 2>/dev/null | grep '"quantize"' | tag $v >> $OUT/quantize-ab.jsonl
  done
  echo "ab $v $(el)"
done
python3 - $OUT <<'PY'
import json, sys, collections
t = collections.defaultdict(list)
for l in open(f"{sys.argv[1]}/quantize-ab.jsonl"):
    o = json.loads(l); t[(o["format"], o["usage"], str(o["shape"]), o["bin"])].append((o["time_us"], o["ratio_to_copy"]))
for k in sorted(t): print(k, t[k])
PY
echo "done $(el)"
