"""Summarise the stack samples written by `host_sample.py` (gdb / cuda-gdb attached to a running
program): per thread kind, the share of samples in which each function (inclusive), each source
line of burn-lowp, and each leaf frame appears.

    python3 benches/profile/host_stacks.py samples.txt [--top 40]

Thread kinds: `main` (the training thread), `device` (CubeCL's device-runner thread, named
`DS…`), others ignored. Function names lose their generic arguments; frames are keyed
`function @ crate-or-file`.
"""
import argparse, collections, re

ap = argparse.ArgumentParser()
ap.add_argument("samples")
ap.add_argument("--top", type=int, default=40)
args = ap.parse_args()

frame_re = re.compile(r"^#(\d+)\s+(?:0x[0-9a-f]+ in )?(.*)$")


def strip_generics(name):
    out, depth = [], 0
    for ch in name:
        if ch == "<":
            depth += 1
        elif ch == ">" and depth:
            depth -= 1
        elif depth == 0:
            out.append(ch)
    return "".join(out)


def key_of(rest):
    func = rest.split(" (", 1)[0]
    func = strip_generics(func).strip()
    where = ""
    m = re.search(r" at (\S+):(\d+)$", rest)
    if m:
        path = m.group(1)
        c = re.search(r"registry/src/[^/]+/([^/]+)/", path)
        where = c.group(1) if c else path
    else:
        m = re.search(r" from (\S+)$", rest)
        if m:
            where = m.group(1).rsplit("/", 1)[-1]
    return func, where, (m.group(1) + ":" + m.group(2)) if m and " at " in rest else ""


samples = collections.defaultdict(list)  # kind -> list of stacks (list of (func, where, line))
cur_kind, cur = None, None
nsamples = 0


def flush():
    if cur_kind and cur is not None:
        samples[cur_kind].append(cur)


for line in open(args.samples, errors="replace"):
    line = line.rstrip("\n")
    if line.startswith("=== sample"):
        flush(); cur_kind, cur = None, None
        nsamples += 1
        continue
    if line.startswith("Thread "):
        flush()
        name = re.search(r'"([^"]*)"\)?:?$', line)
        name = name.group(1) if name else ""
        if name.startswith("DS"):
            cur_kind = "device"
        elif name in ("moe_train",) or "moe_train" in name and not name.startswith("moe_tra:"):
            cur_kind = "main"
        else:
            cur_kind = None
        cur = []
        continue
    m = frame_re.match(line)
    if m and cur is not None:
        cur.append(key_of(m.group(2)))
flush()

print(f"{nsamples} samples")
for kind in ("main", "device"):
    stacks = samples.get(kind, [])
    if not stacks:
        continue
    n = len(stacks)
    incl, leaf, ours = collections.Counter(), collections.Counter(), collections.Counter()
    for st in stacks:
        seen = set()
        for func, where, line in st:
            k = f"{func} @ {where}"
            if k not in seen:
                incl[k] += 1
                seen.add(k)
        if st:
            leaf[f"{st[0][0]} @ {st[0][1]}"] += 1
        seen_lines = set()
        for func, where, line in st:
            if line.startswith("src/") and line not in seen_lines:
                ours[line] += 1
                seen_lines.add(line)
    print(f"\n## thread {kind}: {n} stacks")
    print("\n### inclusive (share of stacks containing the frame)")
    for k, c in incl.most_common(args.top):
        print(f"{100.0 * c / n:5.1f}%  {k[:160]}")
    print("\n### leaf frames")
    for k, c in leaf.most_common(15):
        print(f"{100.0 * c / n:5.1f}%  {k[:160]}")
    print("\n### source lines in src/ (this crate and others' relative paths)")
    for k, c in ours.most_common(args.top):
        print(f"{100.0 * c / n:5.1f}%  {k}")
