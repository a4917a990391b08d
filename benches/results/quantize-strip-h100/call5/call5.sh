#!/usr/bin/env bash
# Call 5: FP8 block scales rewritten for cuBLASLt by one kernel per operand (was Burn ops): the
# rewrite's kernel test, the CUDA module suite (its FP8 block GEMMs against f64), and the FP8
# block GEMMs against torch._scaled_mm with block scales in the same call.
cd "$(dirname "$0")"
rm -rf bin data && tar -xJf bundle.tar.xz
export LOWP_GOLDENS=$PWD/data/goldens LOWP_TEST_DATA=$PWD/data/tests-data LOWP_TEST_DEVICE=cuda
cd ..
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
T0=$(date +%s)
tk=$(ls .gpu/bin/test-kernels* | head -1); tm=$(ls .gpu/bin/test-modules* | head -1); g=$(ls .gpu/bin/bench-gemm* | head -1)
timeout 100 $tk --test-threads=1 cuda::gemm_block_scales > $OUT/test-kernels.log 2>&1; echo "kernels rc=$? ($(( $(date +%s) - T0 )) s)"
grep -hE "^test |^test result|panicked" $OUT/test-kernels.log | head -5
T1=$(date +%s)
timeout 150 $tm --test-threads=1 > $OUT/test-modules.log 2>&1; echo "modules rc=$? ($(( $(date +%s) - T1 )) s)"
grep -hE "^test result|FAILED|panicked" $OUT/test-modules.log | head -10
T2=$(date +%s)
LOWP_BENCH_FILTER="gemm fp8_block" timeout 150 $g --bench > $OUT/gemm.jsonl 2>/tmp/g.err; echo "gemm rc=$? ($(( $(date +%s) - T2 )) s)"; tail -2 /tmp/g.err | cut -c1-200
(cd benches && timeout 150 python3 gemm_torch.py --ours $OUT/gemm.jsonl > $OUT/gemm-torch.jsonl 2>/tmp/gt.err); echo "torch gemm rc=$? ($(( $(date +%s) - T2 )) s)"
grep -h '"compare"' $OUT/gemm-torch.jsonl | grep fp8_block | grep cubecl_stream | cut -c1-220
grep -h '"bench":"gemm"' $OUT/gemm.jsonl | grep cubecl_stream | cut -c1-220
grep -h "gemm_phases" $OUT/gemm.jsonl | grep cubecl_stream | head -8 | cut -c1-300
echo "total $(( $(date +%s) - T0 )) s"
