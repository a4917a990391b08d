#!/usr/bin/env bash
# Call 1 (stop 45): every CUDA test of the kernel and module suites on this tree, one process a
# test (NVRTC compiles in parallel on the machine's 16 cores), the slowest-compiling first.
cd "$(dirname "$0")"
rm -rf bin data old && tar -xJf bundle.tar.xz
export LOWP_GOLDENS=$PWD/data/goldens LOWP_TEST_DATA=$PWD/data/tests-data LOWP_TEST_DEVICE=cuda
cd ..
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
T0=$(date +%s); el() { echo "$(( $(date +%s) - T0 )) s"; }
tk=$(ls .gpu/bin/test-kernels* | head -1); tm=$(ls .gpu/bin/test-modules* | head -1)
$tk --list 2>/dev/null | grep '^cuda::' | sed 's/: test$//' > /tmp/k.txt
$tm --list 2>/dev/null | grep '^cuda::' | sed 's/: test$//' > /tmp/m.txt
echo "kernel tests $(wc -l < /tmp/k.txt), module tests $(wc -l < /tmp/m.txt)"
# Heavy compiles first (earlier calls: quantize_matches_reference 300-400 s, the activation and
# tile suites ~290 s each).
( grep -E 'quantize_matches|tile_quantize|activation|swizzle|decoded|stats' /tmp/k.txt | sed 's/^/k /'
  grep -vE 'quantize_matches|tile_quantize|activation|swizzle|decoded|stats' /tmp/k.txt | sed 's/^/k /'
  sed 's/^/m /' /tmp/m.txt ) > /tmp/queue.txt
mkdir -p $OUT/logs
run_one() {
  b=$tk; [ "$1" = m ] && b=$tm
  f=$OUT/logs/$1-${2//::/-}.log
  s=$(date +%s); timeout 540 $b --exact "$2" --test-threads=1 > "$f" 2>&1; rc=$?
  echo "$1 $2 rc=$rc $(( $(date +%s) - s )) s"
}
export -f run_one; export tk tm OUT
xargs -P 12 -L 1 bash -c 'run_one "$@"' _ < /tmp/queue.txt > $OUT/summary.txt
echo "all done $(el)"
echo "passed: $(grep -c 'rc=0 ' $OUT/summary.txt) of $(wc -l < $OUT/summary.txt)"
grep -v 'rc=0 ' $OUT/summary.txt
sort -k4 -n -r $OUT/summary.txt | head -6
