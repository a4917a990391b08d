#!/usr/bin/env bash
# Call 2 (stop 45): benches on an idle GPU. The MXFP8 rowwise cast, this tree's plane kernel
# ("launcher") beside the unit-per-block kernel it replaces ("tile"), in turns with torch.compile's
# cast; the LayerNormMLP step in turns with PyTorch, twice; the Linear step with PyTorch.
cd "$(dirname "$0")"
rm -rf bin data old && tar -xJf bundle.tar.xz
export LOWP_GOLDENS=$PWD/data/goldens LOWP_TEST_DATA=$PWD/data/tests-data LOWP_TEST_DEVICE=cuda
cd ..
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
T0=$(date +%s); el() { echo "$(( $(date +%s) - T0 )) s"; }
bg=$(ls .gpu/bin/bench-gemm* | head -1); bl=$(ls .gpu/bin/bench-layernorm_mlp* | head -1); bq=$(ls .gpu/bin/bench-quantize* | head -1)
for turn in 1 2; do
  for f in "mxfp8-e4m3 instruction rowwise" "fp8-e4m3-scale instruction rowwise" "mxfp8-e4m3 instruction both"; do
    LOWP_BENCH_FILTER="$f" timeout 60 $bq --bench 2>/dev/null | grep '"quantize"' | grep 16384 | sed "s/^{/{\"turn\":$turn,/" >> $OUT/quantize.jsonl
  done
  timeout 120 python3 benches/quantize_torch.py --shapes 16384x8192 --formats mxfp8-e4m3,fp8-e4m3-scale 2>/dev/null | grep -E 'compile|copy' | sed "s/^{/{\"turn\":$turn,/" >> $OUT/quantize-torch.jsonl
  echo "quantize turn $turn $(el)"
done
python3 - $OUT <<'PY'
import json, sys
for f in ("quantize.jsonl", "quantize-torch.jsonl"):
    for l in open(f"{sys.argv[1]}/{f}"):
        o = json.loads(l)
        print(o.get("turn"), o.get("bench"), o.get("mode", o.get("kernel", "")), o.get("format"), o.get("usage"), o["time_us"], o.get("ratio_to_copy"))
PY
for r in 1 2; do
  timeout 110 python3 benches/layernorm_mlp_torch.py --turns $bl > $OUT/mlp-turns-$r.jsonl 2> /tmp/mlp.err; echo "mlp turns $r rc=$? $(el)"; tail -1 /tmp/mlp.err
  grep -h '"compare"' $OUT/mlp-turns-$r.jsonl | cut -c1-260
done
LOWP_BENCH_FILTER=linear_step timeout 60 $bg --bench > $OUT/linear.jsonl 2>/dev/null; echo "linear $(el)"
timeout 100 python3 benches/gemm_torch.py --ours $OUT/linear.jsonl > $OUT/gemm-torch.jsonl 2>/dev/null; echo "torch gemm $(el)"
grep -h '"compare"' $OUT/gemm-torch.jsonl | grep linear_step | cut -c1-250
echo "done $(el)"
