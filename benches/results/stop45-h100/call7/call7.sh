#!/usr/bin/env bash
# Call 7 (stop 45): issue 12's GEMM figures on the final tree: benches/gemm.rs whole (every shape,
# ordering, the handshake, gemm_raw, the Linear step) and its PyTorch peer right after.
cd "$(dirname "$0")"
rm -rf bin data && tar -xJf bundle.tar.xz
cd ..
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
T0=$(date +%s); el() { echo "$(( $(date +%s) - T0 )) s"; }
bg=$(ls .gpu/bin/bench-gemm* | head -1)
timeout 300 $bg --bench > $OUT/gemm.jsonl 2>/tmp/g.err; echo "gemm rc=$? $(el)"; tail -2 /tmp/g.err
timeout 250 python3 benches/gemm_torch.py --ours $OUT/gemm.jsonl > $OUT/gemm-torch.jsonl 2>/tmp/t.err; echo "torch rc=$? $(el)"; tail -2 /tmp/t.err
grep -h '"compare"' $OUT/gemm-torch.jsonl | cut -c1-220
echo "done $(el)"
