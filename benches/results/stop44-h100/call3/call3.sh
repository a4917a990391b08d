#!/usr/bin/env bash
# Call 3 (stop 44): the norm backward with two row buffers, the transposed FP8 cast for both
# copies only. Benches first, on an idle GPU: Nsight Compute on the norm backward; A/B of the base
# tree's LayerNormMLP bench (old/) against this tree's in turns (passes); the LayerNormMLP step in
# turns with PyTorch; the Linear step with PyTorch. Then the CUDA tests of the changed kernels
# (quantize, grouped quantize, padded FP8, norm) and of the LayerNormMLP / Linear modules.
cd "$(dirname "$0")"
rm -rf bin data old && tar -xJf bundle.tar.xz && mkdir old && tar -xJf old.tar.xz -C old
export LOWP_GOLDENS=$PWD/data/goldens LOWP_TEST_DATA=$PWD/data/tests-data LOWP_TEST_DEVICE=cuda
cd ..
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
T0=$(date +%s); el() { echo "$(( $(date +%s) - T0 )) s"; }
tk=$(ls .gpu/bin/test-kernels* | head -1); tm=$(ls .gpu/bin/test-modules* | head -1)
bg=$(ls .gpu/bin/bench-gemm* | head -1); bl=$(ls .gpu/bin/bench-layernorm_mlp* | head -1); ol=.gpu/old/bench-layernorm_mlp-old
S="--section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats"
LOWP_BENCH_FILTER="mlp_pass gelu norm_backward" timeout 40 ncu --clock-control none --kernel-name regex:norm_backward --launch-skip 5 --launch-count 1 $S $bl --bench > $OUT/ncu-norm-backward.txt 2>&1
echo "ncu rc=$? $(el)"; grep -E "Duration|DRAM Throughput|Compute \(SM\)|Achieved Occupancy|Registers Per|Grid Size" $OUT/ncu-norm-backward.txt
tag() { sed "s/^{/{\"bin\":\"$1\",/"; }
for v in old new old new; do
  b=$bl; [ $v = old ] && b=$ol
  LOWP_BENCH_FILTER="mlp_pass gelu" timeout 40 $b --bench 2>/dev/null | grep mlp_pass | tag $v >> $OUT/passes-ab.jsonl
done
python3 - $OUT <<'PY'
import json, sys, collections
t = collections.defaultdict(list)
for l in open(f"{sys.argv[1]}/passes-ab.jsonl"):
    o = json.loads(l); t[(o["pass"], o["bin"])].append(o["time_us"])
for k in sorted(t): print(k, t[k])
PY
echo "ab $(el)"
timeout 100 python3 benches/layernorm_mlp_torch.py --turns $bl > $OUT/mlp-turns.jsonl 2> /tmp/mlp.err; echo "mlp turns rc=$? $(el)"; tail -1 /tmp/mlp.err
grep -h '"compare"' $OUT/mlp-turns.jsonl | cut -c1-260
LOWP_BENCH_FILTER=linear_step timeout 60 $bg --bench > $OUT/linear.jsonl 2>/dev/null; echo "linear $(el)"
timeout 100 python3 benches/gemm_torch.py --ours $OUT/linear.jsonl > $OUT/gemm-torch.jsonl 2>/dev/null; echo "torch gemm $(el)"
grep -h '"compare"' $OUT/gemm-torch.jsonl | grep linear_step | cut -c1-250
left=$(( 560 - $(date +%s) + T0 ))
timeout $left $tm --test-threads=4 cuda::layernorm cuda::a_stack_of_layernorm cuda::bad_layernorm cuda::linear > $OUT/test-modules.log 2>&1 &
timeout $left $tk --test-threads=16 cuda::quantize_matches cuda::grouped_quantize cuda::grouped_shared cuda::padded_fp8 cuda::norm cuda::delayed_casts cuda::linear_dbias > $OUT/test-kernels.log 2>&1; echo "kernels rc=$? $(el)"
wait; echo "modules done $(el)"
grep -hE "^test .*(ok|FAILED)$|^test result|panicked" $OUT/test-kernels.log | head -14
grep -hE "^test result|FAILED|panicked" $OUT/test-modules.log | head -8
echo "done $(el)"
