#!/usr/bin/env bash
# Call 1 (stop 43): the activation forward loads a step's rows while it computes the previous
# step's, the amax pass keeps four loads a unit in flight, the norm kernels reduce rows by plane
# shuffles on CUDA. CUDA tests of the changed kernels; A/B of the previous stop's bench binaries
# (old/) against this tree's, in turns (passes, FP8 current-scaling quantize, Linear step,
# LayerNormMLP gelu step); the LayerNormMLP step in turns with PyTorch.
cd "$(dirname "$0")"
rm -rf bin data old && tar -xJf bundle.tar.xz && mkdir old && tar -xJf old.tar.xz -C old
export LOWP_GOLDENS=$PWD/data/goldens LOWP_TEST_DATA=$PWD/data/tests-data LOWP_TEST_DEVICE=cuda
cd ..
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
T0=$(date +%s); el() { echo "$(( $(date +%s) - T0 )) s"; }
tk=$(ls .gpu/bin/test-kernels* | head -1); tm=$(ls .gpu/bin/test-modules* | head -1)
declare -A bq bg bl
bq[new]=$(ls .gpu/bin/bench-quantize* | head -1); bg[new]=$(ls .gpu/bin/bench-gemm* | head -1); bl[new]=$(ls .gpu/bin/bench-layernorm_mlp* | head -1)
bq[old]=.gpu/old/bench-quantize-old; bg[old]=.gpu/old/bench-gemm-old; bl[old]=.gpu/old/bench-layernorm_mlp-old
timeout 230 $tk --test-threads=8 cuda::activation cuda::norm cuda::amax_over cuda::quantize_matches cuda::golden cuda::fp8_special cuda::fused::fused_rms_norm cuda::linear_dbias cuda::grouped_quantize > $OUT/test-kernels.log 2>&1; echo "kernels rc=$? $(el)"
grep -hE "^test |^test result|FAILED|panicked" $OUT/test-kernels.log | head -24
timeout 120 $tm --test-threads=4 cuda::layernorm_mlp cuda::a_stack_of_layernorm cuda::bad_layernorm > $OUT/test-modules.log 2>&1; echo "modules rc=$? $(el)"
grep -hE "^test result|FAILED|panicked" $OUT/test-modules.log | head -10
tag() { sed "s/^{/{\"bin\":\"$1\",/"; }
for v in old new old new; do
  LOWP_BENCH_FILTER="mlp_pass gelu" timeout 60 ${bl[$v]} --bench 2>/dev/null | grep mlp_pass | tag $v >> $OUT/passes-ab.jsonl
  LOWP_BENCH_FILTER="fp8-e4m3-current instruction" timeout 60 ${bq[$v]} --bench 2>/dev/null | grep '"quantize"' | grep '16384,8192\|4096,4096' | tag $v >> $OUT/quantize-ab.jsonl
  LOWP_BENCH_FILTER='linear_step current_scaling$' timeout 60 ${bg[$v]} --bench 2>/dev/null | grep linear_step | tag $v >> $OUT/linear-ab.jsonl
  echo "ab $v $(el)"
done
python3 - $OUT <<'PY'
import json, sys, collections
out = sys.argv[1]
t = collections.defaultdict(list)
for f in ("passes-ab", "quantize-ab", "linear-ab"):
    for l in open(f"{out}/{f}.jsonl"):
        o = json.loads(l)
        key = (o.get("pass", o.get("format", o.get("bench"))), str(o.get("usage", o.get("shape", o.get("recipe", "")))), o["bin"])
        t[key].append(o["time_us"])
for k in sorted(t): print(k, t[k])
PY
timeout 150 python3 benches/layernorm_mlp_torch.py --turns ${bl[new]} > $OUT/mlp-turns-new.jsonl 2> /tmp/mlp.err; echo "mlp turns new rc=$? $(el)"; tail -1 /tmp/mlp.err
grep -h '"compare"' $OUT/mlp-turns-new.jsonl | grep '"current_scaling"\|"bf16"' | cut -c1-300
echo "done $(el)"
