#!/usr/bin/env bash
# NVFP4 call 2: why nvfp4_strip_kernel is slow. The CUDA source CubeCL generates for the new
# kernels (compilation log), and Nsight Compute's warp stall reasons, memory tables and SASS
# for one columnwise launch.
cd "$(dirname "$0")"
rm -rf bin data && tar -xJf bundle.tar.xz
cd ..
b=$(ls .gpu/bin/bench-quantize* | head -1)
CUBECL_DEBUG_LOG=/tmp/cubecl.log LOWP_BENCH_FILTER="nvfp4 instruction" timeout 100 $b --bench > /tmp/q.jsonl 2>/tmp/q.err; echo "bench rc=$?"
ls -la /tmp/cubecl.log
python3 - /tmp/cubecl.log $OUT/kernels.cu <<'PY'
import sys,re
text=open(sys.argv[1],errors='replace').read()
out=open(sys.argv[2],'w')
# keep every compiled source block that mentions the new kernels
blocks=re.split(r'(?=\n\S*\s*(?:Compiling|compil))', text)
n=0
for b in blocks:
    if 'nvfp4_strip' in b or 'nvfp4_rowwise' in b:
        out.write(b[:60000]); out.write('\n\n======\n\n'); n+=1
print('blocks',n,'log chars',len(text))
PY
head -c 600 /tmp/cubecl.log
f="nvfp4 instruction columnwise"
LOWP_BENCH_FILTER="$f" timeout 120 ncu --clock-control none --kernel-name regex:nvfp4_strip --launch-skip 5 --launch-count 1 --section WarpStateStats --section MemoryWorkloadAnalysis_Tables --section SourceCounters --section InstructionStats $b --bench > $OUT/ncu-strip-details.txt 2>&1; echo "ncu rc=$?"
LOWP_BENCH_FILTER="$f" timeout 120 ncu --clock-control none --kernel-name regex:nvfp4_strip --launch-skip 5 --launch-count 1 --set full -o /tmp/strip $b --bench > /dev/null 2>&1; echo "ncu full rc=$?"
ncu --import /tmp/strip.ncu-rep --page source --print-source sass --csv 2>/dev/null | head -3000 > $OUT/strip-sass.csv; wc -l $OUT/strip-sass.csv
f="nvfp4 instruction rowwise"
LOWP_BENCH_FILTER="$f" timeout 120 ncu --clock-control none --kernel-name regex:nvfp4_rowwise --launch-skip 5 --launch-count 1 --section WarpStateStats --section InstructionStats $b --bench > $OUT/ncu-rowwise-details.txt 2>&1; echo "ncu rc=$?"
