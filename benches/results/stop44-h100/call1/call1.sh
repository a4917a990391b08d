#!/usr/bin/env bash
# Call 1 (stop 44): the FP8 per-tensor cast with 16-row units and 16-byte transposed stores
# (fp8_cast_transposed_kernel) and the norm backward writing its dγ/dβ partials in the same pass.
# The whole CUDA kernel suite; Nsight Compute on the new kernels and on the base tree's (old/).
cd "$(dirname "$0")"
rm -rf bin data old && tar -xJf bundle.tar.xz && mkdir old && tar -xJf old.tar.xz -C old
export LOWP_GOLDENS=$PWD/data/goldens LOWP_TEST_DATA=$PWD/data/tests-data LOWP_TEST_DEVICE=cuda
cd ..
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
T0=$(date +%s); el() { echo "$(( $(date +%s) - T0 )) s"; }
tk=$(ls .gpu/bin/test-kernels* | head -1)
bq=$(ls .gpu/bin/bench-quantize* | head -1); bl=$(ls .gpu/bin/bench-layernorm_mlp* | head -1)
timeout 430 $tk --test-threads=8 cuda:: > $OUT/test-kernels.log 2>&1; echo "kernels rc=$? $(el)"
grep -hE "^test result|FAILED|panicked" $OUT/test-kernels.log | head -12
S="--section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats"
prof() { # name filter kernel-regex binary
  LOWP_BENCH_FILTER="$2" timeout 50 ncu --clock-control none --kernel-name regex:"$3" --launch-skip 5 --launch-count 1 $S $4 --bench > /tmp/ncu-$1.txt 2>&1
  echo "ncu $1 rc=$? $(el)"; echo "##### $1" >> $OUT/ncu.txt; cat /tmp/ncu-$1.txt >> $OUT/ncu.txt; }
prof cast-both-new "fp8-e4m3-scale instruction both" fp8_cast $bq
prof cast-both-old "fp8-e4m3-scale instruction both" fp8_cast .gpu/old/bench-quantize-old
prof norm-backward-new "mlp_pass gelu norm_backward" norm_backward $bl
prof norm-backward-old "mlp_pass gelu norm_backward" "norm_backward|norm_param" .gpu/old/bench-layernorm_mlp-old
for f in /tmp/ncu-*.txt; do echo "== $f"; grep -E "^  [a-z_0-9]+_kernel|Duration|DRAM Throughput|Compute \(SM\)|Achieved Occupancy|Registers Per|Grid Size" $f | head -9; done
echo "done $(el)"
