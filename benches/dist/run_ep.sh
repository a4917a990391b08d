#!/usr/bin/env bash
# Expert parallelism on one host of N GPUs (N = 2 or 4), from the repository root:
#
#   benches/dist/run_ep.sh MOE_TRAIN N
#
# MOE_TRAIN: the moe_train example built with CUDA and NCCL
#   (cargo build --release --features nccl --example moe_train: target/release/examples/moe_train).
#
# Prints one PASS or FAIL line per check, and a tokens/s table; exits 1 if any check failed.
# 1. EP = one GPU: benches/dist/dp-check.json (20 steps, a loss every step, aux loss off) on one
#    GPU against N ranks with expert_parallel_size 2 and N (`--expert-parallel-size`), bf16 and
#    delayed scaling. With N = 4 and EP = 2 the ranks form 2 EP groups, so the experts'
#    gradients are also reduced over the expert-data-parallel groups. Tolerance as
#    run_2gpu.sh's data-parallel check: step 0 within 0.5 %, every step within 2 %.
# 2. tokens/s of 1 GPU, and of N GPUs data parallel (EP = 1) and with EP = 2 and EP = N,
#    configs/moe-fine-grained.json and configs/moe-1.9b.json, 35 steps (the last 10 timed), no
#    checkpoints.
set -u
BIN=${1:?usage: benches/dist/run_ep.sh MOE_TRAIN N}
N=${2:?usage: benches/dist/run_ep.sh MOE_TRAIN N}
OUT=$(mktemp -d /tmp/dist-ep.XXXXXX)
export NCCL_NVLS_ENABLE=0
FAILED=0
pass() { echo "PASS $*"; }
fail() { echo "FAIL $*"; FAILED=1; }
echo "outputs in $OUT"
eps="2"; [ "$N" -gt 2 ] && eps="2 $N"

# --- 1. expert parallel against one GPU ---------------------------------------------------------
. "$(dirname "$0")/compare_losses.sh"
for recipe in bf16 delayed_scaling; do
  reference_run "ep $recipe" "$OUT/one-$recipe" "$recipe" || continue
  for ep in $eps; do
    check_run "ep=$ep ($N ranks) equals 1 GPU, $recipe" "$OUT/one-$recipe/$recipe/metrics.jsonl" "$OUT/ep$ep-$recipe" "$recipe" \
      --nproc-per-node "$N" --expert-parallel-size "$ep" --config benches/dist/dp-check.json --recipe "recipes/$recipe.json" \
      --no-checkpoint --quiet
  done
done

# --- 2. tokens/s ----------------------------------------------------------------------------------
tokens() { grep -o '"tokens_per_s": *[0-9.eE+]*' "$1" | head -1 | sed 's/.*: *//'; }
echo
echo "| config | ranks | expert_parallel_size | tokens/s | speed-up over 1 GPU |"
echo "|---|---|---|---|---|"
for config in moe-fine-grained moe-1.9b; do
  one="$OUT/tp1-$config"
  CUDA_VISIBLE_DEVICES=0 timeout 300 "$BIN" --config "configs/$config.json" --steps 35 --no-checkpoint --quiet \
    --out "$one" >"$one.log" 2>&1 || { fail "tokens/s $config: the one-GPU run failed (see $one.log)"; tail -3 "$one.log"; continue; }
  t1=$(tokens "$one/bf16/summary.json")
  echo "| $config | 1 | 1 | $(printf '%.0f' "$t1") | 1.00x |"
  for ep in 1 $eps; do
    run="$OUT/tp$N-ep$ep-$config"
    timeout 300 "$BIN" --nproc-per-node "$N" --expert-parallel-size "$ep" --config "configs/$config.json" --steps 35 \
      --no-checkpoint --quiet --out "$run" >"$run.log" 2>&1 \
      || { fail "tokens/s $config, $N ranks, ep=$ep: the run failed (see $run.log)"; tail -3 "$run.log"; continue; }
    t=$(tokens "$run/bf16/summary.json")
    awk -v c="$config" -v n="$N" -v e="$ep" -v a="$t1" -v b="$t" 'BEGIN { printf "| %s | %d | %d | %.0f | %.2fx |\n", c, n, e, b, b / a }'
  done
  pass "tokens/s $config: the runs finished"
done

exit $FAILED
