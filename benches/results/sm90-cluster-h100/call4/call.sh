#!/bin/bash
# Stop 47, call 3: base-clock Nsight Compute of ours, ours in clusters (x2) and PyTorch on the
# E=8 K=7168 fprop; PC sampling of ours: which instructions the warps stall at.
cd benches/sm90_probe
nvcc -O3 -std=c++17 -shared -Xcompiler -fPIC -gencode=arch=compute_90a,code=sm_90a -o libprobe.so harness.cu -lcuda > $OUT/probe-build.txt 2>&1; echo "build rc=$?"
cd ../..
for m in ours_x2 ours_dgrad torch_dgrad; do
  NCU=1 timeout 150 ncu --clock-control base --section SpeedOfLight --section MemoryWorkloadAnalysis --section SchedulerStats -k regex:"lowp_grouped|device_kernel" -c 1 -s 3 python3 .gpu/clock.py $m > $OUT/ncu-$m.txt 2>&1; echo "ncu $m rc=$?"
  grep -E "SM Frequency|Elapsed Cycles|Duration|Compute \(SM\)|L2 Cache Throughput|DRAM Throughput|One or More" $OUT/ncu-$m.txt
done
NCU=1 timeout 200 ncu --clock-control base --section WarpStateStats --section SourceCounters -k regex:"lowp_grouped" -c 1 -s 3 -o /tmp/ours-src python3 .gpu/clock.py ours > /tmp/ncu-src.log 2>&1; echo "ncu src rc=$?"; tail -2 /tmp/ncu-src.log
ncu -i /tmp/ours-src.ncu-rep --page source --csv --print-source sass > /tmp/src.csv 2>/dev/null; echo "export rc=$? $(wc -l < /tmp/src.csv)"
python3 - <<'PY'
import csv
rows = list(csv.reader(open("/tmp/src.csv")))
hdr = rows[0]; print(hdr[:12])
try:
    i_src = hdr.index("Source"); i_s = [i for i, h in enumerate(hdr) if "Warp Stall Sampling (All" in h][0]
except Exception as e:
    print("columns?", e); raise SystemExit
data = []
for r in rows[1:]:
    try: data.append((float(r[i_s] or 0), r[i_src], r[0]))
    except: pass
tot = sum(d[0] for d in data) or 1
for s, src, addr in sorted(data, reverse=True)[:28]:
    print(f"{100*s/tot:5.1f}%  {addr:>6}  {src[:110]}")
PY
cp /tmp/src.csv $OUT/ours-src.csv 2>/dev/null; xz -9 $OUT/ours-src.csv
