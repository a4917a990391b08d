#!/usr/bin/env bash
# Call 5 (stop 45): the test process that crashed at exit in call 4 (cuda::autoswitch_decides_per_expert,
# rc 139 after "test result: ok"), run 48 times, 12 at once, under gdb for a backtrace; then the
# LayerNormMLP step in turns with PyTorch twice (the peer now makes its output gradient in the
# step, as Burn's backward() does) and the Linear step with PyTorch.
cd "$(dirname "$0")"
rm -rf bin data && tar -xJf bundle.tar.xz
export LOWP_GOLDENS=$PWD/data/goldens LOWP_TEST_DATA=$PWD/data/tests-data LOWP_TEST_DEVICE=cuda
cd ..
T0=$(date +%s); el() { echo "$(( $(date +%s) - T0 )) s"; }
tm=$(ls .gpu/bin/test-modules* | head -1); bl=$(ls .gpu/bin/bench-layernorm_mlp* | head -1); bg=$(ls .gpu/bin/bench-gemm* | head -1)
G=$(which gdb cuda-gdb 2>/dev/null | head -1); echo "gdb: $G"
mkdir -p /tmp/crash
one() {
  f=/tmp/crash/$1.log
  if [ -n "$G" ]; then
    timeout 100 $G -q -batch -ex run -ex "thread apply all bt 12" --args $tm --exact cuda::autoswitch_decides_per_expert --test-threads=1 > $f 2>&1
  else
    timeout 100 $tm --exact cuda::autoswitch_decides_per_expert --test-threads=1 > $f 2>&1; echo "rc=$?" >> $f
  fi
}
export -f one; export G tm
seq 1 48 | xargs -P 12 -I{} bash -c 'one {}'
echo "crash runs done $(el)"
grep -l "SIGSEGV\|rc=139" /tmp/crash/*.log | head -3 > /tmp/crashed.txt; echo "crashed: $(wc -l < /tmp/crashed.txt) of 48; passed: $(grep -l 'test result: ok' /tmp/crash/*.log | wc -l)"
for f in $(head -2 /tmp/crashed.txt); do cp $f $OUT/; grep -A 40 "SIGSEGV" $f | grep -E "^#|Thread|SIGSEGV" | head -40; done
for r in 1 2; do
  timeout 110 python3 benches/layernorm_mlp_torch.py --turns $bl > $OUT/mlp-turns-$r.jsonl 2> /tmp/mlp.err; echo "mlp turns $r rc=$? $(el)"; tail -1 /tmp/mlp.err
  grep -h '"compare"' $OUT/mlp-turns-$r.jsonl | grep gelu | cut -c1-260
done
LOWP_BENCH_FILTER=linear_step timeout 60 $bg --bench > $OUT/linear.jsonl 2>/dev/null; echo "linear $(el)"
timeout 100 python3 benches/gemm_torch.py --ours $OUT/linear.jsonl > $OUT/gemm-torch.jsonl 2>/dev/null; echo "torch gemm $(el)"
grep -h '"compare"' $OUT/gemm-torch.jsonl | grep linear_step | cut -c1-250
echo "done $(el)"
