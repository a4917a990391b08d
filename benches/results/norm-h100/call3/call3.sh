#!/usr/bin/env bash
# Call 3 (stop 43): norm forward and backward with the row in registers (16-byte loads) and
# plane-shuffle reductions. CUDA tests of the norm kernels and of the modules on them
# (LayerNormMLP, LayerNormLinear, the fused RMSNorm); Nsight Compute on the new norm kernels;
# A/B of the previous stop's LayerNormMLP bench binary (old/) against this tree's (passes);
# the LayerNormMLP step in turns with PyTorch twice; the Linear step against PyTorch.
cd "$(dirname "$0")"
rm -rf bin data old && tar -xJf bundle.tar.xz && mkdir old && tar -xJf old.tar.xz -C old
export LOWP_GOLDENS=$PWD/data/goldens LOWP_TEST_DATA=$PWD/data/tests-data LOWP_TEST_DEVICE=cuda
cd ..
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
T0=$(date +%s); el() { echo "$(( $(date +%s) - T0 )) s"; }
tk=$(ls .gpu/bin/test-kernels* | head -1); tm=$(ls .gpu/bin/test-modules* | head -1)
bg=$(ls .gpu/bin/bench-gemm* | head -1); bl=$(ls .gpu/bin/bench-layernorm_mlp* | head -1); ol=.gpu/old/bench-layernorm_mlp-old
timeout 150 $tk --test-threads=8 cuda::norm cuda::fused::fused_rms_norm cuda::fused::fused_adamw > $OUT/test-kernels.log 2>&1; echo "kernels rc=$? $(el)"
grep -hE "^test |^test result|FAILED|panicked" $OUT/test-kernels.log | head -12
timeout 150 $tm --test-threads=4 cuda::layernorm cuda::a_stack_of_layernorm cuda::bad_layernorm > $OUT/test-modules.log 2>&1; echo "modules rc=$? $(el)"
grep -hE "^test |^test result|FAILED|panicked" $OUT/test-modules.log | head -14
S="--section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats"
prof() { LOWP_BENCH_FILTER="mlp_pass gelu $1" timeout 60 ncu --clock-control none --kernel-name regex:"$2" --launch-skip 5 --launch-count 1 $S $bl --bench > /tmp/ncu-$3.txt 2>&1; echo "ncu $3 rc=$? $(el)"; echo "##### $3" >> $OUT/ncu-norm.txt; cat /tmp/ncu-$3.txt >> $OUT/ncu-norm.txt; }
prof norm_forward norm_forward_kernel norm-forward
prof norm_backward norm_backward_kernel norm-backward
for f in /tmp/ncu-*.txt; do echo "== $f"; grep -E "Duration|DRAM Throughput|Compute \(SM\)|Achieved Occupancy|Registers Per|Issued Warp|Warp Cycles Per Issued" $f | head -10; done
tag() { sed "s/^{/{\"bin\":\"$1\",/"; }
for v in old new old new; do
  b=$bl; [ $v = old ] && b=$ol
  LOWP_BENCH_FILTER="mlp_pass gelu" timeout 60 $b --bench 2>/dev/null | grep mlp_pass | tag $v >> $OUT/passes-ab.jsonl
done
python3 - $OUT <<'PY'
import json, sys, collections
t = collections.defaultdict(list)
for l in open(f"{sys.argv[1]}/passes-ab.jsonl"):
    o = json.loads(l); t[(o["pass"], o["bin"])].append(o["time_us"])
for k in sorted(t): print(k, t[k])
PY
echo "ab $(el)"
for run in 1 2; do
  timeout 150 python3 benches/layernorm_mlp_torch.py --turns $bl > $OUT/mlp-turns-$run.jsonl 2> /tmp/mlp.err; echo "mlp turns $run rc=$? $(el)"; tail -1 /tmp/mlp.err
  grep -h '"compare"' $OUT/mlp-turns-$run.jsonl | grep '"current_scaling"\|"bf16"' | cut -c1-300
done
LOWP_BENCH_FILTER=linear_step timeout 60 $bg --bench > $OUT/linear.jsonl 2>/dev/null; echo "linear $(el)"
timeout 120 python3 benches/gemm_torch.py --ours $OUT/linear.jsonl > $OUT/gemm-torch.jsonl 2>/dev/null; echo "torch gemm $(el)"
grep -h '"compare"' $OUT/gemm-torch.jsonl | grep linear_step | cut -c1-250
echo "done $(el)"
