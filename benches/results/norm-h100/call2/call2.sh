#!/usr/bin/env bash
# Call 2 (stop 43): the CUDA tests call 1 left unfinished at its time limit (same bundle), and
# Nsight Compute on the norm kernels, the amax-only activation pass and the FP8 cast with the
# activation prologue (gelu, 8192 x 16384 / 8192 x 4096 bf16), to say what bounds them.
cd "$(dirname "$0")"
rm -rf bin data && tar -xJf bundle.tar.xz
export LOWP_GOLDENS=$PWD/data/goldens LOWP_TEST_DATA=$PWD/data/tests-data LOWP_TEST_DEVICE=cuda
cd ..
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
T0=$(date +%s); el() { echo "$(( $(date +%s) - T0 )) s"; }
tk=$(ls .gpu/bin/test-kernels* | head -1); bl=$(ls .gpu/bin/bench-layernorm_mlp* | head -1)
timeout 330 $tk --test-threads=8 cuda::activation_fused cuda::activations_match cuda::quantize_matches_reference > $OUT/test-kernels-2.log 2>&1; echo "kernels rc=$? $(el)"
grep -hE "^test |^test result|FAILED|panicked" $OUT/test-kernels-2.log | head -12
S="--section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats --section SchedulerStats --section MemoryWorkloadAnalysis"
prof() { LOWP_BENCH_FILTER="mlp_pass gelu $1" timeout 90 ncu --clock-control none --kernel-name regex:"$2" --launch-skip 5 --launch-count 1 $S $bl --bench > $OUT/ncu-$3.txt 2>&1; echo "ncu $3 rc=$? $(el)"; }
prof norm_forward norm_forward_kernel norm-forward
prof norm_backward norm_backward_kernel norm-backward
prof norm_backward norm_param_partials norm-partials
prof activation_cast_current activation_forward_kernel act-amax
prof activation_cast_current fp8_cast_kernel act-cast
for f in $OUT/ncu-*.txt; do echo "== $f"; grep -E "Duration|DRAM Throughput|Memory Throughput|Compute \(SM\)|Achieved Occupancy|Theoretical Occupancy|Registers Per|Block Limit Reg|Issued Warp|No Eligible|Stall" $f | head -24; done
echo "done $(el)"
