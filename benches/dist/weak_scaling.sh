#!/usr/bin/env bash
# Weak scaling on one host, from the repository root:
#
#   benches/dist/weak_scaling.sh MOE_TRAIN OUT [DATA]
#
# MOE_TRAIN: the moe_train example built with CUDA and NCCL; OUT: a directory for the runs;
# DATA: a text file to train on (default: the built-in corpus). Each rank keeps the one-GPU batch
# (the config's batch_size times the ranks), 35 steps, the last 10 timed (log_every 25), no
# checkpoints, bf16. Prints one line a run (tokens/s of the global batch, step ms, final loss,
# peak memory) and writes them to OUT/scaling.txt:
# * moe-fine-grained: 1 GPU; 2 ranks data parallel with the gradient reduction overlapped with
#   backward (train.overlap_grad_reduce, the default) and after it, BF16 and FP32 all-reduce;
#   2 ranks expert parallel (EP = 2), overlapped or not;
# * moe-1.9b: 1 GPU; 2 ranks data parallel, overlapped or not, autotuned GEMM algorithms and
#   cuBLASLt's heuristic ones (LOWP_GEMM_AUTOTUNE=0: the two runs then train bit for bit alike).
# NGPU=4 runs the ranks' entries on 4 GPUs (EP = 4 instead of 2).
set -u
BIN=${1:?usage: benches/dist/weak_scaling.sh MOE_TRAIN OUT [DATA]}
OUT=${2:?usage: benches/dist/weak_scaling.sh MOE_TRAIN OUT [DATA]}
DATA=${3:+--data $3}
N=${NGPU:-2}
export NCCL_NVLS_ENABLE=0
mkdir -p "$OUT"
field() { grep -o "\"$1\": *[0-9.eE+]*" "$2" | head -1 | sed 's/.*: *//'; }
# run TAG CONFIG GPUS EP TRAIN_OVERRIDES (a Python dict)
run() {
  local tag=$1 config=$2 n=$3 ep=$4 extra=$5 o="$OUT/$1"
  python3 -c "import json; c = json.load(open('configs/$config.json')); c['train']['batch_size'] *= $n; c['train'].update($extra); json.dump(c, open('$o.json', 'w'))"
  if [ "$n" = 1 ]; then
    CUDA_VISIBLE_DEVICES=0 timeout 300 "$BIN" --config "$o.json" --steps 35 --no-checkpoint --quiet $DATA --out "$o" >"$o.log" 2>&1
  else
    timeout 300 "$BIN" --nproc-per-node "$n" --expert-parallel-size "$ep" --config "$o.json" --steps 35 --no-checkpoint --quiet $DATA --out "$o" >"$o.log" 2>&1
  fi
  local rc=$? s="$o/bf16/summary.json"
  echo "$tag: $config gpus=$n ep=$ep $extra rc=$rc tokens_per_s=$(field tokens_per_s "$s") step_ms=$(field step_ms "$s") final_loss=$(field final_loss "$s") peak_memory_bytes=$(field peak_memory_bytes "$s")" | tee -a "$OUT/scaling.txt"
}
run fg-1 moe-fine-grained 1 1 "{}"
run fg-dp-bf16reduce-overlap moe-fine-grained $N 1 "{'grad_reduce_in_fp32': False}"
run fg-dp-bf16reduce-after moe-fine-grained $N 1 "{'grad_reduce_in_fp32': False, 'overlap_grad_reduce': False}"
run fg-dp-overlap moe-fine-grained $N 1 "{}"
run fg-dp-after moe-fine-grained $N 1 "{'overlap_grad_reduce': False}"
run fg-ep-overlap moe-fine-grained $N $N "{}"
run fg-ep-after moe-fine-grained $N $N "{'overlap_grad_reduce': False}"
run g19-1 moe-1.9b 1 1 "{}"
run g19-dp-overlap moe-1.9b $N 1 "{}"
run g19-dp-after moe-1.9b $N 1 "{'overlap_grad_reduce': False}"
LOWP_GEMM_AUTOTUNE=0 run g19-dp-overlap-heuristic moe-1.9b $N 1 "{}"
LOWP_GEMM_AUTOTUNE=0 run g19-dp-after-heuristic moe-1.9b $N 1 "{'overlap_grad_reduce': False}"
