#!/usr/bin/env bash
# Runs the CUDA tests of test binaries one process a test, several at once, and prints one line a
# test ("rc=0" passed) and a count. NVRTC compiles a test's kernels on the CPU, one kernel at a
# time per process, so one process for a whole suite spends most of its time compiling (the
# kernel suite did not finish in 430 s on the GPU machine); 12 processes on its 16 cores run the
# 84 tests of the kernel and module suites in about 150 s (H100, 2026-11-27).
#
#   tests/run_cuda_tests.sh [-j JOBS] [-o LOG_DIR] BINARY...
#
# BINARY: test binaries built with `--features cuda` (`cargo test --features cuda --no-run` prints
# their paths: the kernels and modules binaries under target/*/deps/) and run with
# LOWP_TEST_DEVICE=cuda (unless set otherwise), so that a missing GPU fails instead of skipping.
# The slowest-compiling tests start first. Exit status: 0 when every test passed.
set -u
export LOWP_TEST_DEVICE=${LOWP_TEST_DEVICE:-cuda}
jobs=12
logs=$(mktemp -d)
while getopts "j:o:" opt; do
  case $opt in
    j) jobs=$OPTARG ;;
    o) logs=$OPTARG; mkdir -p "$logs" ;;
    *) exit 2 ;;
  esac
done
shift $((OPTIND - 1))
[ $# -gt 0 ] || { echo "usage: $0 [-j JOBS] [-o LOG_DIR] BINARY..." >&2; exit 2; }
queue=$(mktemp)
for bin in "$@"; do
  "$bin" --list 2>/dev/null | sed -n 's/^\(cuda::.*\): test$/\1/p' | sed "s|^|$bin |"
done | sort -k2 | awk '{ heavy = ($2 ~ /quantize_matches|grouped_quantize|tile_quantize|activation|swizzle|decoded|stats/); print heavy ? 0 : 1, $0 }' \
  | sort -s -k1,1 | cut -d' ' -f2- > "$queue"
[ -s "$queue" ] || { echo "no cuda:: tests in $*" >&2; exit 2; }
run_one() {
  log="$logs/$(basename "$1")-${2//::/-}.log"
  start=$(date +%s)
  "$1" --exact "$2" --test-threads=1 > "$log" 2>&1
  rc=$?
  echo "$(basename "$1") $2 rc=$rc $(( $(date +%s) - start )) s"
}
export -f run_one; export logs
xargs -P "$jobs" -L 1 bash -c 'run_one "$@"' _ < "$queue" | tee "$logs/summary.txt"
total=$(wc -l < "$logs/summary.txt"); passed=$(grep -c ' rc=0 ' "$logs/summary.txt")
echo "passed $passed of $total (logs: $logs)"
[ "$passed" -eq "$total" ]
