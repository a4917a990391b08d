#!/usr/bin/env bash
# CUDA tests of the tree with the four-row activation kernels; LayerNormMLP passes and steps
# (rounds, PyTorch in turns); MoE 1.9B 150 steps with this tree (new) and the session's start
# (old, 8ae676b), alternating, and the PyTorch peer.
rm -rf "$(dirname "$0")/bin"
source "$(dirname "$0")/common.sh"
cd ..
export LOWP_GOLDENS=$PWD/.gpu/data/goldens LOWP_TEST_DATA=$PWD/.gpu/data/tests-data LOWP_TEST_DEVICE=cuda
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
T0=$(date +%s)
for t in .gpu/bin/test-kernels* .gpu/bin/test-modules*; do
  n=$(basename $t | cut -d- -f1-2)
  echo "=== $n"; timeout 280 "$t" --test-threads=1 > $OUT/$n.log 2>&1; echo "rc=$?"
  grep -hE "^test result|FAILED|panicked" $OUT/$n.log | head -20
done
echo "tests took $(( $(date +%s) - T0 )) s"
B=$(ls .gpu/bin/bench-layernorm_mlp*)
LOWP_BENCH_FILTER=mlp_pass timeout 60 $B --bench > $OUT/mlp-pass.jsonl 2>&1; echo "passes rc=$?"
grep mlp_pass $OUT/mlp-pass.jsonl
T1=$(date +%s)
timeout 250 python3 .gpu/layernorm_mlp_torch.py --turns $B > $OUT/mlp-turns.jsonl 2> $OUT/mlp-turns.err; echo "mlp turns rc=$? $(( $(date +%s) - T1 )) s"
tail -2 $OUT/mlp-turns.err
grep -h '"compare"\|"impl"' $OUT/mlp-turns.jsonl | cut -c1-260
cd .gpu
for r in bf16 delayed_scaling current_scaling; do
  moe moe_train moe-1.9b $r 150 1.9b-$r-new
  moe moe_train_old moe-1.9b $r 150 1.9b-$r-old
done
t0=$(date +%s)
timeout 120 python3 ../benches/peer/moe_train_torch.py --config ../configs/moe-1.9b.json --data /tmp/corpus.txt --steps 150 --out $OUT/torch-1.9b.json > /tmp/torch.log 2>&1; echo "torch 1.9b rc=$? ($(( $(date +%s) - t0 )) s)"; tail -1 /tmp/torch.log | cut -c1-300
echo "total $(( $(date +%s) - T0 )) s"
