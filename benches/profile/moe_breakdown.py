#!/usr/bin/env python3
"""GPU time of a traced `moe_train` run by what the step does, per step, one or two runs side by side.

Reads the CSV that `cupti_trace.c` writes, cuts the run into steps as `cupti_summary.py --steps N
--step-end KERNEL` does (each step ends with the last of its launches of KERNEL, e.g. AdamW's
`adamw`; the first `--skip` steps are left out), and prints a markdown table of milliseconds and
launches per step by category: the grouped (expert) GEMMs by kind (fprop, dgrad, wgrad) and by
implementation (our sm90 kernels, cuBLASLt's pointer-array batch, one cuBLASLt GEMM per expert),
the dense GEMMs, attention, FP8 casts, amax and scale passes, routing and permutation, norms,
activations, the optimizer, Burn's elementwise ops, fills and copies, stream handshakes, and the
idle gaps between kernels (the GPU waiting for the host, or work already queued); then the same
time by region of the step (expert layers forward/backward, attention, the rest), the names
behind the grouped GEMMs, and every kernel it could not place ("other", with its name).

    python3 moe_breakdown.py bf16.csv [current.csv] --labels bf16,current --steps 14 \\
        --step-end adamw [--skip 3] [--moe-layers 4 --micro-batches 2]
    python3 moe_breakdown.py --self-test

How a grouped GEMM's kind is told (names alone cannot: fprop and dgrad run the same kernels, and
the per-expert wgrad the same cuBLASLt kernels as the dense layers): by where it is launched in
host order (the correlation ids, which follow the program: one device thread enqueues both
CubeCL's kernels and the cuBLASLt/sm90 launches). An MoE layer's expert GEMMs lie in a window
that opens with the dispatch's row gather (`row_gather_kernel`, forward) or the combine's
backward (`combine_rows_backward_kernel` / `combine_weights_grad_kernel`) and closes with
`combine_rows_kernel` (the combine forward, or the dispatch's backward). In a forward window
every GEMM is an fprop. In a backward window the second expert linear (fc2) comes first, then
the SwiGLU backward (`activation_backward_kernel`), then fc1; within each, dgrad runs before
wgrad. Our sm90 grouped kernels and the pointer-array batch never run a wgrad, so with one of
them in a linear's share the per-expert cuBLASLt GEMMs there are its wgrad; without one (dgrad
per expert too, `grouped::per_group_pays`) the first half of its per-expert GEMMs is the dgrad.
Attention's batched products lie between `split_heads_kernel` and `merge_heads_kernel` (both
directions). Names give strong hints that are checked against the position and counted where they
disagree: `lowp_grouped_gemm_*_nn_*` and `*e5m2*` are dgrads, `lowp_grouped_wgrad_*` wgrads,
cuBLASLt's `ptrBatch_NN*` (BF16 on the weights as stored) and `qr*` (an E5M2 operand, the hybrid
recipes' gradient) dgrads. `--moe-layers L --micro-batches M` checks the windows found per step
(L·M each way) and that each backward window held both kinds. What this cannot see: a GEMM that
the code moves out of those windows (a new fused kernel taking a marker's place); the checks then
report it, and the marker names here are the one place to update.
"""

import argparse
import collections
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cupti_summary import classify, load, union_and_gaps  # noqa: E402

# ---- kernel names -------------------------------------------------------------------------------
# CubeCL kernels are named after their #[cube] function, with a suffix of generic parameters
# (`fp8_cast_kernel_n_4`, `group_epilogue_kernel_i_i32`): matched by prefix.

CATEGORIES = [
    # (category, prefixes)
    ("FP8 casts", ["fp8_cast_kernel", "fp8_cast_transposed_kernel"]),
    ("amax passes", ["amax_kernel", "amax_rht_kernel", "group_amax_kernel", "dbias_amax_kernel",
                     "group_dbias_amax_kernel", "delayed_update_kernel"]),
    ("scale passes (group_epilogue, row scales)", ["group_epilogue_kernel", "group_row_scale_kernel",
                                                   "spread_words_kernel"]),
    ("other quantize (block, MXFP8, NVFP4, dequantize)", [
        "fp8_block_kernel", "fp8_block_transposed_kernel", "mxfp8_kernel", "mxfp8_rowwise_kernel",
        "mxfp8_strip_kernel", "nvfp4_kernel", "nvfp4_rowwise_kernel", "nvfp4_strip_kernel",
        "dequantize_", "gemm_block_scales_kernel", "swizzle_kernel", "unswizzle_kernel"]),
    ("routing and permutation", [
        "top_k_kernel", "chunk_rank_kernel", "chunk_scan_kernel", "expert_position_kernel",
        "group_scan_kernel", "group_rows_kernel", "route_rows_kernel", "row_gather_kernel",
        "row_gather_vector_kernel", "combine_rows_kernel", "combine_rows_backward_kernel",
        "combine_rows_backward_vector_kernel", "combine_weights_grad_kernel",
        "group_partials_sum_kernel"]),
    ("attention softmax", ["causal_softmax_kernel", "causal_softmax_backward_kernel",
                           "causal_softmax_vector_kernel", "causal_softmax_backward_vector_kernel"]),
    ("attention head split/merge, RoPE", ["split_heads_kernel", "merge_heads_kernel", "rope_kernel",
                                          "split_heads_vector_kernel", "merge_heads_vector_kernel"]),
    ("norms", ["norm_forward_kernel", "norm_backward_kernel", "norm_param_partials_kernel",
               "column_partials_sum_kernel"]),
    ("activations (SwiGLU)", ["activation_forward_kernel", "activation_backward_kernel"]),
    ("optimizer (AdamW)", ["adamw_kernel"]),
    ("gradient norm (sum of squares)", ["sum_squares_partials_kernel"]),
    ("stream handshakes (wait/signal)", ["wait_kernel", "signal_kernel"]),
    ("debug statistics", ["stats_records_kernel", "tensor_stats_kernel"]),
    ("fills and copies", ["fill_kernel", "full_kernel", "copy_kernel", "copy_words_kernel",
                          "copy_kernel_pack", "copy_perpendicular", "into_contiguous", "slice_kernel",
                          "slice_assign_kernel", "slice_with_steps_kernel", "repeat_dim_kernel",
                          "zeros_array"]),
    ("elementwise and reductions (Burn)", [
        "kernel_binop", "kernel_scalar_binop", "kernel_cmp", "kernel_scalar_cmp", "kernel_predicate",
        "unary_float", "unary_int", "unary_numeric", "cast_element", "bool_cast_kernel", "reduce_kernel",
        "shared_sum_kernel", "launch_plane_reduce", "launch_plane_topk", "gather_kernel", "scatter_kernel",
        "select_kernel", "select_assign_kernel", "mask_fill_kernel", "mask_where_kernel",
        "cumulative_kernel", "prng_kernel", "kernel_to_unit_interval"]),
]

GEMM_KINDS = ["fprop", "dgrad", "wgrad"]
IMPLS = ["ours (sm90)", "cuBLASLt ptrBatch", "per-expert cuBLASLt"]
DENSE = "dense GEMMs (attention projections, router, LM head)"
ATTN_GEMM = "attention products (QKᵀ, PV and their gradients)"
OTHER = "other (names below)"
TABLE_ORDER = ([f"grouped {k}: {i}" for k in GEMM_KINDS for i in IMPLS]
               + [DENSE, ATTN_GEMM] + [c for c, _ in CATEGORIES] + [OTHER])

# Window markers (module docs).
# (the row kernels' word/pair versions, or their vector versions where rows are whole 16-byte vectors)
FWD_OPEN = ("row_gather_kernel", "row_gather_vector_kernel")
BWD_OPEN = ("combine_rows_backward_kernel", "combine_rows_backward_vector_kernel", "combine_weights_grad_kernel")
CLOSE = "combine_rows_kernel"
BWD_SPLIT = "activation_backward_kernel"
# (the pair kernels, or the vector kernels where a head is whole 16-byte vectors)
HEADS_OPEN = ("split_heads_kernel", "split_heads_vector_kernel")
HEADS_CLOSE = ("merge_heads_kernel", "merge_heads_vector_kernel")


def starts(name, prefix):
    # A CubeCL name is the function's name, or it followed by `_<generic suffix>`.
    return name == prefix or name.startswith(prefix + "_") or (prefix.endswith("_") and name.startswith(prefix))


def static_category(name):
    for category, prefixes in CATEGORIES:
        if any(starts(name, p) for p in prefixes):
            return category
    return None


def gemm_impl(name):
    """'ours', 'ptr', 'lt' (one cuBLASLt/CUTLASS/CubeCL GEMM) or None (not a GEMM)."""
    if name.startswith(("lowp_grouped_gemm", "lowp_grouped_wgrad")):
        return "ours"
    if "ptrBatch" in name:
        return "ptr"
    low = name.lower()
    if (name.startswith(("nvjet", "sm90_xmma", "sm80_xmma", "cutlass", "_ZN7cutlass", "matmul_entry"))
            or "gemm" in low or "splitkreduce" in low or "gemv" in low or "xmma" in low):
        return "lt"
    return None


def name_hint(name, impl):
    """The kind a name says for sure, or None (module docs)."""
    if impl == "ours":
        if name.startswith("lowp_grouped_wgrad"):
            return "wgrad"
        if "_nn_" in name or "e5m2" in name:
            return "dgrad"
    if impl == "ptr":
        tail = name.split("ptrBatch_", 1)[-1]
        if tail.startswith("NN") or "_qrtst_" in name or name.startswith("nvjet_sm90_qr"):
            return "dgrad"
    return None


def base(name):
    return name.split("(")[0]


def classify_records(gpu):
    """Puts a `cat` (a TABLE_ORDER row), a `region` and, for grouped GEMMs, `kind` and `impl` on
    every record, walking them in host order; returns the per-run findings (windows, hints)."""
    found = collections.Counter()
    hint_conflicts = collections.Counter()
    expert, heads, part = None, False, 0
    # Backward windows' linears: [kinds their batched GEMMs ran, [per-expert GEMM records]].
    shares = []

    def resolve(share):
        batched, plain = share
        # A batched dgrad leaves the per-expert GEMMs the wgrad; a K-grouped wgrad leaves them
        # the dgrad; with neither, each expert runs its dgrad, then its wgrad.
        cut = 0 if "dgrad" in batched else len(plain) if "wgrad" in batched else len(plain) // 2
        for i, r in enumerate(plain):
            r["gemm_kind"] = "dgrad" if i < cut else "wgrad"

    for r in sorted(gpu, key=lambda r: r["corr"]):
        name = base(r["name"])
        r["region"] = ("attention" if heads else
                       {"fwd": "expert layers, forward", "bwd": "expert layers, backward"}.get(expert, "rest"))
        known = static_category(name)  # (`gemm_block_scales_kernel` is no GEMM)
        impl = gemm_impl(name) if r["kind"] == "kernel" and known is None else None
        if r["kind"] in ("memcpy", "memset"):
            r["cat"] = "fills and copies"
        elif impl is None:
            r["cat"] = known or OTHER
        elif heads:
            r["cat"] = ATTN_GEMM
        elif expert is None:
            r["cat"] = DENSE
        else:
            r["impl"] = impl
            if expert == "fwd":
                r["gemm_kind"] = "fprop"
            elif impl == "lt":
                shares[-1][1].append(r)  # resolved when the linear's share ends
            else:
                # Our kernels' and the pointer-array batch's backward GEMMs are dgrads, but the
                # K-grouped wgrad, which its name says.
                r["gemm_kind"] = name_hint(name, impl) if name_hint(name, impl) == "wgrad" else "dgrad"
                shares[-1][0].add(r["gemm_kind"])
        # Markers move the state after the record that carries them.
        if name.startswith(HEADS_OPEN):
            heads = True
        elif name.startswith(HEADS_CLOSE):
            heads = False
        elif name.startswith(FWD_OPEN) and expert is None and not heads:
            expert = "fwd"
            r["opens"] = "fwd"
            found["fwd windows"] += 1
        elif name.startswith(BWD_OPEN) and expert != "bwd":
            expert, part = "bwd", 0
            r["opens"] = "bwd"
            found["bwd windows"] += 1
            shares.append([set(), []])
        elif name.startswith(BWD_SPLIT) and expert == "bwd":
            resolve(shares[-1])
            shares.append([set(), []])
            part += 1
        elif name.startswith(CLOSE) and expert is not None:
            if expert == "bwd":
                resolve(shares[-1])
            expert = None
    if expert == "bwd" and shares:
        resolve(shares[-1])
    for r in gpu:
        if "impl" in r:
            label = {"ours": IMPLS[0], "ptr": IMPLS[1], "lt": IMPLS[2]}[r["impl"]]
            r["cat"] = f"grouped {r['gemm_kind']}: {label}"
            hint = name_hint(base(r["name"]), r["impl"])
            if hint and hint != r["gemm_kind"]:
                hint_conflicts[(r["gemm_kind"], hint, base(r["name"]))] += 1
    return found, hint_conflicts


def step_windows(gpu, steps, step_end, skip):
    """[(first, last + 1)] indices (GPU-start order) of the steps kept (`cupti_summary.per_step`)."""
    ends = [i for i, r in enumerate(gpu) if step_end in r["name"]]
    per = len(ends) // steps if steps else 0
    if per == 0 or per * steps != len(ends):
        sys.exit(f"{len(ends)} launches of {step_end!r} do not divide into {steps} steps")
    last = [ends[(k + 1) * per - 1] for k in range(steps)]
    windows = [(last[k] + 1, last[k + 1] + 1) for k in range(skip, steps - 1)]
    if not windows:
        sys.exit(f"no step left after skipping {skip} of {steps}")
    return windows


def analyse(path, steps, step_end, skip, layers=None, micro_batches=None):
    gpu, api, _ = load(path)
    if not gpu:
        sys.exit(f"{path}: no GPU records")
    found, conflicts = classify_records(gpu)
    windows = step_windows(gpu, steps, step_end, skip)
    n = len(windows)
    ms = collections.Counter()
    launches = collections.Counter()
    regions = collections.Counter()
    names = collections.defaultdict(collections.Counter)  # category -> (name, grid) -> ns
    opened = collections.Counter()  # expert windows opened in the kept steps
    totals = collections.Counter()
    for a, b in windows:
        seg = gpu[a:b]
        totals["wall"] += seg[-1]["end"] - seg[0]["start"]
        busy, gaps = union_and_gaps(seg)
        totals["busy"] += busy
        for gap, _prev, nxt, prev_end in gaps:
            totals["idle: " + classify(nxt, prev_end, api)] += gap
            totals["gaps"] += 1
        for r in seg:
            t = r["end"] - r["start"]
            ms[r["cat"]] += t
            launches[r["cat"]] += 1
            regions[r["region"]] += t
            totals["records"] += t
            if r["cat"].startswith("grouped") or r["cat"] == OTHER:
                names[r["cat"]][(base(r["name"]), r["detail"])] += t
            if "opens" in r:
                opened[r["opens"]] += 1
    scale = 1e6 * n
    result = {
        "path": path, "steps": n,
        "ms": {k: v / scale for k, v in ms.items()},
        "launches": {k: v / n for k, v in launches.items()},
        "regions": {k: v / scale for k, v in regions.items()},
        "totals": {k: v / scale for k, v in totals.items()},
        "names": names, "found": found, "conflicts": conflicts, "scale": scale,
    }
    result["totals"]["gaps"] = totals["gaps"] / n
    checks = []
    fwd, bwd = opened["fwd"] / n, opened["bwd"] / n
    if layers and micro_batches:
        want = layers * micro_batches
        checks.append((f"expert windows a step: forward {fwd:g}, backward {bwd:g} (expected {want})",
                       fwd == want and bwd == want))
    for kind in GEMM_KINDS:
        count = sum(v for k, v in result["launches"].items() if k.startswith(f"grouped {kind}"))
        # Each expert linear runs at least one launch of each kind a window (two linears a layer).
        checks.append((f"grouped {kind} launches a step: {count:g} (at least {2 * bwd:g})", count >= 2 * bwd > 0))
    if conflicts:
        checks.append((f"name hints disagreeing with the position: {sum(conflicts.values())} launches", False))
    result["checks"] = checks
    return result


def fmt(v, digits=2):
    return f"{v:.{digits}f}" if v else "-"


def print_report(runs, labels):
    cols = " | ".join(f"{l} ms | {l} launches" for l in labels)
    delta = len(runs) == 2
    print(f"| per step | {cols}{' | Δ ms' if delta else ''} |")
    print("|---|" + "---|---|" * len(runs) + ("---|" if delta else ""))

    def row(label, values, counts=None):
        cells = []
        for i, v in enumerate(values):
            c = counts[i] if counts else None
            cells.append(f"{fmt(v)} | {fmt(c, 0) if c is not None else ''}")
        d = f" | {values[1] - values[0]:+.2f}" if delta else ""
        print(f"| {label} | {' | '.join(cells)}{d} |")

    def sums(prefix):
        return ([sum(v for k, v in r["ms"].items() if k.startswith(prefix)) for r in runs],
                [sum(v for k, v in r["launches"].items() if k.startswith(prefix)) for r in runs])

    for kind in GEMM_KINDS:
        v, c = sums(f"grouped {kind}")
        row(f"**grouped {kind}**", v, c)
        for impl in IMPLS:
            cat = f"grouped {kind}: {impl}"
            if any(r["ms"].get(cat) for r in runs):
                row(f"&nbsp;&nbsp;{impl}", [r["ms"].get(cat, 0) for r in runs],
                    [r["launches"].get(cat, 0) for r in runs])
    for cat in TABLE_ORDER:
        if cat.startswith("grouped"):
            continue
        if any(r["ms"].get(cat) for r in runs):
            row(cat, [r["ms"].get(cat, 0) for r in runs], [r["launches"].get(cat, 0) for r in runs])
    t = [r["totals"] for r in runs]
    row("*sum of GPU records*", [x["records"] for x in t])
    row("*GPU busy (union over streams)*", [x["busy"] for x in t])
    row("*overlap between streams (sum - busy)*", [x["records"] - x["busy"] for x in t])
    for cause, label in (("host", "the GPU waiting for the host"), ("queued", "work already queued"),
                         ("no launch record", "no launch record")):
        row(f"*idle: {label}*", [x.get("idle: " + cause, 0) for x in t])
    row("**wall (step)**", [x["wall"] for x in t])
    print()
    print("Regions of the step (ms of GPU records; expert layers = between dispatch and combine):")
    print()
    print("| region | " + " | ".join(labels) + " |")
    print("|---|" + "---|" * len(runs))
    for region in ("expert layers, forward", "expert layers, backward", "attention", "rest"):
        print(f"| {region} | " + " | ".join(fmt(r["regions"].get(region, 0)) for r in runs) + " |")
    for label, r in zip(labels, runs):
        print(f"\n{label} ({r['path']}, {r['steps']} steps):")
        for cat in [c for c in TABLE_ORDER if c.startswith("grouped")] + [OTHER]:
            if r["names"].get(cat):
                print(f"  {cat}:")
                for (name, grid), ns in r["names"][cat].most_common(8 if cat != OTHER else 100):
                    print(f"    {ns / r['scale']:8.2f} ms  grid/block {grid:>22}  {name[:100]}")
        for text, ok in r["checks"]:
            print(f"  check: {text}: {'ok' if ok else 'CHECK FAILED'}")
        for (kind, hint, name), count in sorted(r["conflicts"].items()):
            print(f"  position says {kind}, name says {hint}: {count} x {name[:90]}")


# ---- self-test -------------------------------------------------------------------------------------

def synthetic_trace(path):
    """Two steps of a toy MoE (two layers, one micro-batch): forward, backward, AdamW. The BF16
    step runs fprop on our kernel and dgrad on the pointer-array batch; in the second layer's
    backward, fc2 runs dgrad per expert and the K-grouped wgrad, fc1 both per expert."""
    rows, t, corr = [], 1000, 1

    def k(name, dur=10_000, stream=7, grid="132x1x1/384x1x1"):
        nonlocal t, corr
        rows.append(f'kernel,{t},{t + dur},{stream},{corr},{grid},"{name}"')
        rows.append(f'driver,{t - 500},{t - 400},1,{corr},0,"cuLaunchKernel"')
        t += dur + 1000
        corr += 1

    lt = "nvjet_sm90_tst_128x128_64x6_2x1_v_bz_NTT"
    for _step in range(3):
        for layer in range(2):
            k("norm_forward_kernel_n_4")
            k(lt)  # qkv
            # The second layer's attention takes the vector kernels' names.
            k("split_heads_vector_kernel_n_4" if layer else "split_heads_kernel")
            k(lt)
            k("causal_softmax_vector_kernel_n_4" if layer else "causal_softmax_kernel")
            k(lt)
            k("merge_heads_vector_kernel_n_4" if layer else "merge_heads_kernel")
            k(lt)  # proj
            k(lt)  # router
            k("top_k_kernel")
            k("route_rows_kernel")
            k("row_gather_vector_kernel_i_i32" if layer else "row_gather_kernel_i_i32")
            k("lowp_grouped_gemm_bf16_tn_256")
            k("activation_forward_kernel_n_4")
            k("nvjet_sm90_tst_256x128_64x4_2x1_v_bz_coopA_ptrBatch_TNT")
            k("combine_rows_kernel")
            k("kernel_binop_c_bf16_n_8")
        k(lt)  # lm head
        for layer in range(2):
            k("combine_rows_backward_vector_kernel" if layer else "combine_rows_backward_kernel")
            k("combine_weights_grad_kernel")
            if layer == 0:
                k("nvjet_sm90_tst_256x128_64x4_2x1_v_bz_coopA_ptrBatch_NNT")
                for e in range(4):
                    k(lt, stream=20 + e)
                k("activation_backward_kernel_n_4")
                k("lowp_grouped_gemm_bf16_nn_256")
                for e in range(4):
                    k(lt, stream=20 + e)
            else:
                for e in range(4):  # dgrad per expert, then the K-grouped wgrad
                    k(lt, stream=20 + e % 4)
                k("lowp_grouped_wgrad_bf16_256")
                k("activation_backward_kernel_n_4")
                for e in range(8):
                    k(lt, stream=20 + e % 4)
            k("combine_rows_kernel")
            k("causal_softmax_backward_kernel")
            k("split_heads_kernel")
            k(lt)
            k("merge_heads_kernel")
            k("mystery_kernel")
        k("fill_kernel")
        k("adamw_kernel")
    with open(path, "w") as f:
        f.write("kind,start_ns,end_ns,stream,correlation,detail,name\n" + "\n".join(rows) + "\n")


def self_test():
    import tempfile
    path = os.path.join(tempfile.mkdtemp(), "synthetic.csv")
    synthetic_trace(path)
    r = analyse(path, steps=3, step_end="adamw", skip=0, layers=2, micro_batches=1)
    launches = r["launches"]
    want = {
        "grouped fprop: ours (sm90)": 2, "grouped fprop: cuBLASLt ptrBatch": 2,
        "grouped dgrad: cuBLASLt ptrBatch": 1, "grouped dgrad: ours (sm90)": 1,
        "grouped dgrad: per-expert cuBLASLt": 8, "grouped wgrad: per-expert cuBLASLt": 12,
        "grouped wgrad: ours (sm90)": 1,
        ATTN_GEMM: 6, DENSE: 7, OTHER: 2,
    }
    failures = [(k, launches.get(k, 0), v) for k, v in want.items() if launches.get(k, 0) != v]
    failures += [(text, ok, True) for text, ok in r["checks"] if not ok]
    print_report([r, r], ["a", "b"])
    for f in failures:
        print("self-test FAIL:", f)
    print(f"self-test: {'ok' if not failures else 'FAILED'}")
    return not failures


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("traces", nargs="*", help="one or two CSVs of cupti_trace.c")
    parser.add_argument("--labels", help="comma-separated, one a trace (default: the file names)")
    parser.add_argument("--steps", type=int, help="steps in the traced run (each trace)")
    parser.add_argument("--step-end", default="adamw", help="a kernel each step ends with")
    parser.add_argument("--skip", type=int, default=3, help="first steps left out")
    parser.add_argument("--moe-layers", type=int, help="MoE layers of the model (checks)")
    parser.add_argument("--micro-batches", type=int, help="micro-batches a step (checks)")
    parser.add_argument("--self-test", action="store_true", help="classify a synthetic trace")
    args = parser.parse_args()
    if args.self_test:
        sys.exit(0 if self_test() else 1)
    if not args.traces or len(args.traces) > 2 or not args.steps:
        parser.error("one or two traces and --steps")
    labels = args.labels.split(",") if args.labels else [os.path.basename(p) for p in args.traces]
    if len(labels) != len(args.traces):
        parser.error("one label a trace")
    runs = [analyse(p, args.steps, args.step_end, args.skip, args.moe_layers, args.micro_batches)
            for p in args.traces]
    print_report(runs, labels)


if __name__ == "__main__":
    main()
