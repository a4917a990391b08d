#!/usr/bin/env python3
"""Where a traced run's GPU time goes: busy time, idle gaps and what each gap waited for.

Reads the CSV that `cupti_trace.c` writes (kernels, memcpys and memsets with their GPU times and
streams; the driver calls that enqueue or wait, with their CPU times; one clock for both).

The run is cut into segments wherever the GPU idles longer than `--split-ms` (a benchmark's
device synchronizations between its timed runs); every segment gets one line, and the chosen one
(`--segment`, default: the longest, normally the timed run of the bench) gets the detail:
* kernels by name: launches, total and mean GPU time, share of the segment;
* the idle gaps between GPU work (the union over all streams), by size, each classed as
  `host` when the work after it was enqueued (its launch call returned on the CPU) only after the
  GPU had gone idle, so the GPU waited for the CPU, or `queued` when it was already enqueued, so
  the gap is the GPU's own (launch latency, a wait on another stream's event);
* the largest gaps with the work on either side, and the driver calls of the segment.

    python3 cupti_summary.py trace.csv [--segment N] [--split-ms 1.0] [--per N]
    python3 cupti_summary.py trace.csv --steps N --step-end KERNEL [--skip S]

`--per N` also divides the segment's figures by N (steps or calls in the timed run).
`--chrome FILE` also writes the trace in the Chrome trace format, a timeline for Perfetto
(ui.perfetto.dev) or chrome://tracing: one row per stream for the GPU, one per thread for the
driver calls.
`--steps N --step-end KERNEL` cuts a training run of N steps into steps instead (each step ends
with the last of its launches of KERNEL, which every step launches equally often, e.g. the
optimizer's `adamw`), leaves out the first S, and gives the per-step wall time, GPU busy time and
idle time, the idle split by cause, and the kernels by GPU time per step.
"""

import argparse
import collections
import csv
import json


def load(path):
    gpu, api = [], {}
    api_rows = []
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            rec = {
                "kind": row["kind"],
                "start": int(row["start_ns"]),
                "end": int(row["end_ns"]),
                "stream": int(row["stream"]),
                "corr": int(row["correlation"]),
                "detail": row["detail"],
                "name": row["name"],
            }
            if rec["kind"] == "driver":
                api[rec["corr"]] = rec
                api_rows.append(rec)
            else:
                gpu.append(rec)
    gpu.sort(key=lambda r: r["start"])
    api_rows.sort(key=lambda r: r["start"])
    return gpu, api, api_rows


def short(name, width=70):
    return name if len(name) <= width else name[: width - 3] + "..."


def segments(gpu, split_ns):
    """Runs of GPU work separated by idle time longer than split_ns."""
    out, current, busy_end = [], [], None
    for rec in gpu:
        if current and rec["start"] - busy_end > split_ns:
            out.append(current)
            current = []
        current.append(rec)
        busy_end = rec["end"] if len(current) == 1 else max(busy_end, rec["end"])
    if current:
        out.append(current)
    return out


def union_and_gaps(records):
    """Busy time (union of intervals) and the idle gaps between them, each as (gap_ns, the
    record that ended last before it, the record after it, the time the GPU went idle)."""
    busy, gaps = 0, []
    cur_start, cur_end, cur_last = None, None, None
    for rec in records:
        if cur_end is None:
            cur_start, cur_end, cur_last = rec["start"], rec["end"], rec
            continue
        if rec["start"] > cur_end:
            busy += cur_end - cur_start
            gaps.append((rec["start"] - cur_end, cur_last, rec, cur_end))
            cur_start, cur_end, cur_last = rec["start"], rec["end"], rec
        elif rec["end"] > cur_end:
            cur_end, cur_last = rec["end"], rec
    if cur_end is not None:
        busy += cur_end - cur_start
    return busy, gaps


def classify(gap_end_rec, prev_end, api):
    launch = api.get(gap_end_rec["corr"])
    if launch is None:
        return "no launch record"
    return "host" if launch["end"] > prev_end else "queued"


def per_step(gpu, api, steps, step_end, skip):
    """Per-step figures of a training run (see the module docs)."""
    ends = [i for i, r in enumerate(gpu) if step_end in r["name"]]
    per = len(ends) // steps
    if per == 0 or per * steps != len(ends):
        print(f"{len(ends)} launches of {step_end!r} do not divide into {steps} steps")
        return
    last = [ends[(k + 1) * per - 1] for k in range(steps)]
    windows = [(last[k] + 1, last[k + 1] + 1) for k in range(skip, steps - 1)]
    totals = collections.Counter()
    by_name = collections.Counter()
    for a, b in windows:
        seg = gpu[a:b]
        totals["wall"] += seg[-1]["end"] - seg[0]["start"]
        busy, gaps = union_and_gaps(seg)
        totals["busy"] += busy
        totals["records"] += len(seg)
        for gap, _prev, nxt, prev_end in gaps:
            cause = classify(nxt, prev_end, api)
            totals[cause] += gap
            totals[cause + " count"] += 1
        for r in seg:
            by_name[(r["kind"], r["name"])] += r["end"] - r["start"]
    n = len(windows)
    wall, busy = totals["wall"] / n, totals["busy"] / n
    print(f"{n} steps (of {steps}, the first {skip} left out; {per} launches of {step_end!r} a step)")
    print(f"per step: wall {wall / 1e3:.1f} us, GPU busy {busy / 1e3:.1f} us ({100 * busy / wall:.1f} %), "
          f"{totals['records'] / n:.0f} GPU records")
    for cause in ("host", "queued", "no launch record"):
        print(f"  idle, {cause}: {totals[cause] / n / 1e3:.1f} us in {totals[cause + ' count'] / n:.0f} gaps")
    print(f"\n{'us/step':>10} {'share':>6}  kind name")
    for (kind, name), total in by_name.most_common(25):
        print(f"{total / n / 1e3:10.1f} {100 * total / n / wall:5.1f}%  {kind} {short(name)}")


def write_chrome(path, gpu, api_rows):
    """The records as Chrome trace events (microseconds from the first record)."""
    t0 = min([r["start"] for r in gpu] + [a["start"] for a in api_rows])
    events = []
    for r in gpu:
        events.append({"name": r["name"], "cat": r["kind"], "ph": "X", "pid": "GPU",
                       "tid": f"stream {r['stream']}", "ts": (r["start"] - t0) / 1e3,
                       "dur": (r["end"] - r["start"]) / 1e3,
                       "args": {"correlation": r["corr"], "detail": r["detail"]}})
    for a in api_rows:
        events.append({"name": a["name"], "cat": "driver", "ph": "X", "pid": "CPU",
                       "tid": f"thread {a['stream']}", "ts": (a["start"] - t0) / 1e3,
                       "dur": (a["end"] - a["start"]) / 1e3, "args": {"correlation": a["corr"]}})
    with open(path, "w") as f:
        json.dump({"traceEvents": events, "displayTimeUnit": "ns"}, f)
    print(f"wrote {len(events)} events to {path}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trace")
    parser.add_argument("--segment", type=int, default=None,
                        help="index of the segment to detail (default: the longest)")
    parser.add_argument("--split-ms", type=float, default=1.0)
    parser.add_argument("--per", type=int, default=1, help="calls or steps in the segment")
    parser.add_argument("--top", type=int, default=12)
    parser.add_argument("--steps", type=int, help="steps in the traced training run")
    parser.add_argument("--step-end", help="a kernel each step ends with (e.g. adamw)")
    parser.add_argument("--skip", type=int, default=3, help="first steps left out")
    parser.add_argument("--chrome", help="also write a Chrome trace (JSON) here")
    args = parser.parse_args()

    gpu, api, api_rows = load(args.trace)
    if not gpu:
        print("no GPU records")
        return
    if args.chrome:
        write_chrome(args.chrome, gpu, api_rows)
    if args.steps and args.step_end:
        per_step(gpu, api, args.steps, args.step_end, args.skip)
        return
    segs = segments(gpu, int(args.split_ms * 1e6))
    print(f"{len(gpu)} GPU records, {len(api_rows)} driver calls kept, {len(segs)} segments "
          f"(split at {args.split_ms} ms idle)")
    for i, seg in enumerate(segs):
        wall = max(r["end"] for r in seg) - seg[0]["start"]
        busy, _ = union_and_gaps(seg)
        if wall > 200_000 or i == len(segs) - 1:
            print(f"  segment {i}: {len(seg)} records, wall {wall / 1e3:.1f} us, "
                  f"busy {busy / 1e3:.1f} us ({100 * busy / max(wall, 1):.1f} %)")
    index = args.segment
    if index is None:
        index = max(range(len(segs)), key=lambda i: max(r["end"] for r in segs[i]) - segs[i][0]["start"])
    seg = segs[index]
    per = max(args.per, 1)
    t0, t1 = seg[0]["start"], max(r["end"] for r in seg)
    wall = t1 - t0
    busy, gaps = union_and_gaps(seg)
    print(f"\n== segment {index}: wall {wall / 1e3:.1f} us, busy {busy / 1e3:.1f} us "
          f"({100 * busy / wall:.1f} %), idle {(wall - busy) / 1e3:.1f} us; per call/step (/{per}): "
          f"wall {wall / per / 1e3:.1f} us, busy {busy / per / 1e3:.1f} us, "
          f"{len(seg) / per:.1f} GPU records")

    streams = collections.Counter()
    for r in seg:
        streams[r["stream"]] += r["end"] - r["start"]
    print("GPU time by stream: " + ", ".join(
        f"{s}: {t / per / 1e3:.1f} us" for s, t in streams.most_common()))

    by_name = collections.defaultdict(lambda: [0, 0])
    for r in seg:
        key = (r["kind"], r["name"])
        by_name[key][0] += 1
        by_name[key][1] += r["end"] - r["start"]
    print(f"\n{'launches/call':>13} {'us/call':>9} {'mean us':>8} {'share':>6}  kind name")
    for (kind, name), (count, total) in sorted(by_name.items(), key=lambda kv: -kv[1][1]):
        print(f"{count / per:13.1f} {total / per / 1e3:9.1f} {total / count / 1e3:8.1f} "
              f"{100 * total / wall:5.1f}%  {kind} {short(name)}")

    buckets = [(0, 2e3), (2e3, 5e3), (5e3, 10e3), (10e3, 50e3), (50e3, float("inf"))]
    table = {(b, c): [0, 0] for b in buckets for c in ("host", "queued", "no launch record")}
    classified = []
    for gap, prev, nxt, prev_end in gaps:
        launch = api.get(nxt["corr"])
        cause = classify(nxt, prev_end, api)
        classified.append((gap, prev, nxt, cause, launch))
        for b in buckets:
            if b[0] <= gap < b[1]:
                table[(b, cause)][0] += 1
                table[(b, cause)][1] += gap
    print("\nidle gaps per call/step: size -> count, total us (host = the GPU waited for the CPU to "
          "enqueue; queued = the work was enqueued already)")
    for b in buckets:
        label = f"{b[0] / 1e3:g}-{b[1] / 1e3:g} us" if b[1] != float("inf") else f">{b[0] / 1e3:g} us"
        cells = []
        for cause in ("host", "queued", "no launch record"):
            count, total = table[(b, cause)]
            if count:
                cells.append(f"{cause} {count / per:.1f} x, {total / per / 1e3:.1f} us")
        if cells:
            print(f"  {label:>12}: " + "; ".join(cells))
    print(f"\nlargest {args.top} gaps:")
    for gap, prev, nxt, cause, launch in sorted(classified, key=lambda g: -g[0])[: args.top]:
        lag = f", launch returned {(launch['end'] - prev['end']) / 1e3:+.1f} us after prev end" if launch else ""
        print(f"  {gap / 1e3:8.1f} us {cause:6} after {prev['kind']} {short(prev['name'], 45)} "
              f"(stream {prev['stream']}) before {nxt['kind']} {short(nxt['name'], 45)} "
              f"(stream {nxt['stream']}){lag}")

    calls = collections.defaultdict(lambda: [0, 0])
    for a in api_rows:
        if t0 - 5_000_000 <= a["start"] <= t1:
            calls[a["name"]][0] += 1
            calls[a["name"]][1] += a["end"] - a["start"]
    print("\ndriver calls from 5 ms before the segment to its end, per call/step: count, CPU us")
    for name, (count, total) in sorted(calls.items(), key=lambda kv: -kv[1][1]):
        print(f"  {count / per:8.1f} {total / per / 1e3:9.1f}  {name}")


if __name__ == "__main__":
    main()
