# Sums an Nsight Compute CSV (`ncu --csv --print-units base --metrics
# gpu__time_duration.sum,launch__grid_size,launch__block_size ...`) by kernel name: total time,
# launches, mean, and the most common (grid, block) of each name, so a slow generic kernel
# (a reduce, a matmul) can be told apart by its launch shape.
# Usage: python3 kernels_by_name.py ncu.csv [top]
import csv
import sys
from collections import Counter, defaultdict


def number(text):
    return float(text.replace(",", ""))


def main():
    path = sys.argv[1]
    top = int(sys.argv[2]) if len(sys.argv) > 2 else 40
    rows = defaultdict(dict)  # launch id -> metric -> value, plus the name
    with open(path, newline="") as f:
        lines = [l for l in f if l.startswith('"')]
    for r in csv.DictReader(lines):
        key = r["ID"]
        rows[key]["name"] = r["Kernel Name"].split("(")[0].split("<")[0].strip()
        rows[key][r["Metric Name"]] = r["Metric Value"]
    time = defaultdict(float)
    count = Counter()
    shapes = defaultdict(Counter)
    for r in rows.values():
        if "gpu__time_duration.sum" not in r:
            continue
        ns = number(r["gpu__time_duration.sum"])
        name = r["name"]
        time[name] += ns
        count[name] += 1
        shapes[name][(r.get("launch__grid_size", "?"), r.get("launch__block_size", "?"))] += 1
    total = sum(time.values())
    launches = sum(count.values())
    print(f"{launches} kernels, {total / 1e6:.1f} ms of kernel time ({total / 1e3 / max(launches, 1):.1f} us mean)")
    for name, ns in sorted(time.items(), key=lambda kv: -kv[1])[:top]:
        (grid, block), _ = shapes[name].most_common(1)[0]
        print(f"{ns / 1e6:9.2f} ms {count[name]:6d} x {ns / 1e3 / count[name]:9.1f} us  grid {grid:>8} block {block:>5}  {name[:90]}")


if __name__ == "__main__":
    main()
