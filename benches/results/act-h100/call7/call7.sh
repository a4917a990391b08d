#!/usr/bin/env bash
# Call 7: A/B of taller FP8 per-tensor cast tiles (LOWP_FP8_SUB_TILES: 1 = 32 rows a cube as
# before, 2 or 4 tiles stacked along M). CUDA FP8 tests with 4; the casts of 16384x8192 bf16 in
# every direction, the Linear step and the gelu current-scaling LayerNormMLP step, alternating.
cd "$(dirname "$0")"
rm -rf bin data && tar -xJf bundle.tar.xz
export LOWP_GOLDENS=$PWD/data/goldens LOWP_TEST_DATA=$PWD/data/tests-data LOWP_TEST_DEVICE=cuda
cd ..
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
T0=$(date +%s); el() { echo "$(( $(date +%s) - T0 )) s"; }
tk=$(ls .gpu/bin/test-kernels* | head -1); bq=$(ls .gpu/bin/bench-quantize* | head -1); bg=$(ls .gpu/bin/bench-gemm* | head -1); bl=$(ls .gpu/bin/bench-layernorm_mlp* | head -1)
LOWP_FP8_SUB_TILES=4 timeout 260 $tk --test-threads=8 cuda::golden cuda::quantize_matches cuda::fp8_special cuda::delayed cuda::activation_fused cuda::tile_quantize cuda::padded cuda::bad_shapes cuda::linear_dbias > $OUT/test-kernels-subtiles4.log 2>&1; echo "kernels (4) rc=$? $(el)"
grep -hE "^test result|FAILED|panicked" $OUT/test-kernels-subtiles4.log | head -10
for round in 1 2; do for st in 1 2 4; do
  for f in "fp8-e4m3-scale instruction" "fp8-e4m3-current instruction"; do
    LOWP_FP8_SUB_TILES=$st LOWP_BENCH_FILTER="$f" timeout 60 $bq --bench 2>/dev/null | grep '"quantize"' | grep '16384,8192' | sed "s/^{/{\"sub_tiles\":$st,\"round\":$round,/" >> $OUT/quantize-ab.jsonl
  done
  LOWP_FP8_SUB_TILES=$st LOWP_BENCH_FILTER='linear_step current_scaling$' timeout 60 $bg --bench 2>/dev/null | grep linear_step | sed "s/^{/{\"sub_tiles\":$st,\"round\":$round,/" >> $OUT/linear-ab.jsonl
  LOWP_FP8_SUB_TILES=$st LOWP_BENCH_FILTER='mlp_step gelu current_scaling$' timeout 90 $bl --bench 2>/dev/null | grep mlp_step | sed "s/^{/{\"sub_tiles\":$st,\"round\":$round,/" >> $OUT/mlp-ab.jsonl
  echo "round $round sub_tiles $st $(el)"
done; done
python3 - $OUT <<'PY'
import json, sys, collections
out = sys.argv[1]
t = collections.defaultdict(list)
for f in ("quantize-ab", "linear-ab", "mlp-ab"):
    for l in open(f"{out}/{f}.jsonl"):
        o = json.loads(l)
        key = (o.get("format", o.get("bench")), o.get("usage", o.get("recipe", "")), o["sub_tiles"])
        t[key].append(o["time_us"])
for k in sorted(t): print(k, t[k])
PY
# Every Linear recipe with 1 and with 4 tiles a cube, then PyTorch's step (compared with the first).
for st in 1 4; do LOWP_FP8_SUB_TILES=$st LOWP_BENCH_FILTER=linear_step timeout 60 $bg --bench > $OUT/linear-$st.jsonl 2>/dev/null; echo "linear $st $(el)"; done
timeout 120 python3 benches/gemm_torch.py --ours $OUT/linear-1.jsonl > $OUT/gemm-torch.jsonl 2>/dev/null; echo "torch gemm $(el)"
grep -h '"compare"' $OUT/gemm-torch.jsonl | grep linear_step | cut -c1-250
grep -h linear_step $OUT/gemm-torch.jsonl | grep torch_bf16 | cut -c1-200; grep -h linear_step $OUT/linear-4.jsonl | cut -c1-200
echo "done $(el)"
