#!/usr/bin/env python3
"""MoE training runs of ours and of the PyTorch twin (`benches/peer/moe_train_torch.py`) on one
machine with one or more GPUs, and the tables made of them.

Three kinds of run:

* `parity`: our bf16 and the twin's eager BF16 on the same config, data and seeds; the loss gap
  against the seed spread. Loss runs are not timed, so several share a GPU (`--jobs-per-gpu`).
* `recipes`: our model under each recipe file, same seed and data; final and held-out loss
  against the bf16 run.
* `turns`: step times of ours (each recipe) and of the twin (each `--peer-modes` mode), taking
  turns on one GPU round after round (an H100/H200 changes clock with heat and power; runs timed
  back to back in one order would favour whoever runs first), nothing else on that GPU.

Every run's summary lands in `--out` (`<name>.json`, ours the example's `summary.json`), and the
table is printed and written to `--out/table.md`.

    python3 benches/moe_runs.py parity --ours ./moe_train --config configs/moe-235m.json \\
        --seeds 42 7 1234 --steps 300 --data corpus.txt --gpus 0,1 --jobs-per-gpu 2 --out runs/parity
    python3 benches/moe_runs.py recipes --ours ./moe_train --config configs/moe-235m.json \\
        --recipes recipes/*.json --steps 1000 --data corpus.txt --gpus 0,1,2,3 --out runs/recipes
    python3 benches/moe_runs.py turns --ours ./moe_train --config configs/moe-fine-grained.json \\
        --recipes recipes/bf16.json recipes/current_scaling.json --peer-modes eager compile fp8 \\
        --rounds 2 --steps 100 --data corpus.txt --gpus 0 --out runs/turns

`--ours` is the built example (`cargo build --release --features cuda --example moe_train`);
`--peer` the twin script (default: beside this file). A run that fails is reported in the table
with the end of its log and does not stop the others.
"""
import argparse
import json
import os
import queue
import statistics
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def run_config_with(path, seed, out_dir):
    """A copy of the run config `path` with `train.seed` set (the example takes its seed from
    the config), written under `out_dir`."""
    with open(path) as f:
        config = json.load(f)
    config.setdefault("train", {})["seed"] = seed
    name = f"{os.path.splitext(os.path.basename(path))[0]}-seed{seed}.json"
    copy = os.path.join(out_dir, "configs", name)
    os.makedirs(os.path.dirname(copy), exist_ok=True)
    with open(copy, "w") as f:
        json.dump(config, f, indent=1)
    return copy


class Job:
    """One training process: its command, where its summary lands, and its label."""

    def __init__(self, name, command, summary, log):
        self.name, self.command, self.summary, self.log = name, command, summary, log
        self.result, self.seconds = None, None

    def run(self, gpu):
        env = dict(os.environ, CUDA_VISIBLE_DEVICES=str(gpu), PYTHONUNBUFFERED="1")
        start = time.time()
        with open(self.log, "w") as log:
            code = subprocess.call(self.command, stdout=log, stderr=subprocess.STDOUT, env=env)
        self.seconds = time.time() - start
        if code == 0 and os.path.exists(self.summary):
            with open(self.summary) as f:
                self.result = json.load(f)
        else:
            with open(self.log) as f:
                tail = f.read()[-600:]
            self.result = {"error": f"exit {code}", "log_tail": tail}
        status = "failed" if "error" in self.result else "done"
        print(f"[{time.strftime('%H:%M:%S')}] gpu {gpu}: {self.name} {status} in {self.seconds:.0f} s", flush=True)
        return self.result


def ours(args, name, config, recipe, steps, extra=()):
    out = os.path.join(args.out, "ours", name)
    label = os.path.splitext(os.path.basename(recipe))[0]
    command = [args.ours, "--config", config, "--recipe", recipe, "--steps", str(steps), "--quiet",
               "--no-checkpoint", "--out", out, *args.ours_args.split(), *extra]
    if args.data:
        command += ["--data", args.data]
    return Job(name, command, os.path.join(out, label, "summary.json"), os.path.join(args.out, "logs", name + ".log"))


def peer(args, name, config, mode, steps, seed=None):
    summary = os.path.join(args.out, "peer", name + ".json")
    command = [sys.executable, args.peer, "--config", config, "--mode", mode, "--steps", str(steps), "--out", summary,
               *args.peer_args.split()]
    if seed is not None:
        command += ["--seed", str(seed)]
    if args.data:
        command += ["--data", args.data]
    return Job(name, command, summary, os.path.join(args.out, "logs", name + ".log"))


def run_pool(jobs, gpus, per_gpu):
    """Runs `jobs` with `per_gpu` at a time on each GPU; returns when all are done."""
    work = queue.Queue()
    for job in jobs:
        work.put(job)

    def worker(gpu):
        while True:
            try:
                job = work.get_nowait()
            except queue.Empty:
                return
            job.run(gpu)

    threads = [threading.Thread(target=worker, args=(g,)) for g in gpus for _ in range(per_gpu)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def mean_spread(values):
    """Mean and half the range (the seed spread), or Nones for no values."""
    if not values:
        return None, None
    return statistics.mean(values), (max(values) - min(values)) / 2


def fmt(value, digits=4):
    return "-" if value is None else f"{value:.{digits}f}"


def failed(jobs):
    return [j for j in jobs if "error" in j.result]


def parity(args):
    jobs = []
    for config in args.config:
        base = os.path.splitext(os.path.basename(config))[0]
        for seed in args.seeds:
            seeded = run_config_with(config, seed, args.out)
            jobs.append(ours(args, f"{base}-ours-seed{seed}", seeded, args.bf16, args.steps))
            jobs.append(peer(args, f"{base}-peer-eager-seed{seed}", config, "eager", args.steps, seed))
    run_pool(jobs, args.gpus, args.jobs_per_gpu)
    lines = ["| config | side | seeds | final loss (mean ± spread) | held-out loss (mean ± spread) | per seed (final) |",
             "|---|---|---|---|---|---|"]
    for config in args.config:
        base = os.path.splitext(os.path.basename(config))[0]
        for side in ("ours", "peer-eager"):
            runs = [j for j in jobs if j.name.startswith(f"{base}-{side}-seed") and "error" not in j.result]
            final = [j.result["final_loss"] for j in runs]
            held = [j.result.get("eval_loss") for j in runs if j.result.get("eval_loss") is not None]
            fm, fs = mean_spread(final)
            hm, hs = mean_spread(held)
            per_seed = ", ".join(f"{j.name.rsplit('seed', 1)[1]}: {j.result['final_loss']:.4f}" for j in runs)
            lines.append(f"| {base} | {side} | {len(runs)} | {fmt(fm)} ± {fmt(fs)} | {fmt(hm)} ± {fmt(hs)} | {per_seed} |")
    return jobs, lines


def recipes(args):
    config = run_config_with(args.config[0], args.seeds[0], args.out)
    jobs = [ours(args, os.path.splitext(os.path.basename(r))[0], config, r, args.steps) for r in args.recipes]
    run_pool(jobs, args.gpus, args.jobs_per_gpu)
    base = next((j.result for j in jobs if j.name == "bf16" and "error" not in j.result), None)
    lines = ["| recipe | final loss | vs bf16 | held-out loss | vs bf16 | ms/step (shared GPU, not a timing) |",
             "|---|---|---|---|---|---|"]
    for j in jobs:
        r = j.result
        if "error" in r:
            continue
        gap = eval_gap = None
        if base:
            gap = 100 * (r["final_loss"] / base["final_loss"] - 1)
            eval_gap = 100 * (r["eval_loss"] / base["eval_loss"] - 1)
        lines.append(f"| {j.name} | {r['final_loss']:.4f} | {fmt(gap, 2)} % | {r['eval_loss']:.4f} | {fmt(eval_gap, 2)} % | {r['step_ms']:.1f} |")
    return jobs, lines


def turns(args):
    if len(args.gpus) != 1:
        sys.exit("turns: one GPU (--gpus N), nothing else running on it")
    config = args.config[0]
    base = os.path.splitext(os.path.basename(config))[0]
    jobs = []
    for round_ in range(args.rounds):
        sides = [ours(args, f"{base}-ours-{os.path.splitext(os.path.basename(r))[0]}-round{round_}", config, r, args.steps)
                 for r in args.recipes]
        sides += [peer(args, f"{base}-peer-{m}-round{round_}", config, m, args.steps) for m in args.peer_modes]
        # Alternate the order between rounds, so neither side always runs first.
        jobs += sides if round_ % 2 == 0 else sides[::-1]
    for job in jobs:
        job.run(args.gpus[0])
    names = [f"ours-{os.path.splitext(os.path.basename(r))[0]}" for r in args.recipes] + [f"peer-{m}" for m in args.peer_modes]
    lines = [f"| {base} | ms/step per round | median | tokens/s (median) |", "|---|---|---|---|"]
    medians = {}
    for name in names:
        runs = [j.result for j in jobs if j.name.startswith(f"{base}-{name}-round") and "error" not in j.result]
        ms = [r["step_ms"] for r in runs]
        if ms:
            medians[name] = statistics.median(ms)
            lines.append(f"| {name} | {', '.join(f'{v:.1f}' for v in ms)} | {medians[name]:.1f} | {statistics.median(r['tokens_per_s'] for r in runs):.0f} |")
    if medians:
        best_peer = min((v, k) for k, v in medians.items() if k.startswith("peer-")) if any(k.startswith("peer-") for k in medians) else None
        for name, value in medians.items():
            if name.startswith("ours-") and best_peer:
                lines.append(f"| {name} vs the fastest peer ({best_peer[1]}) | | {best_peer[0] / value:.2f}x | |")
    return jobs, lines


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("kind", choices=["parity", "recipes", "turns"])
    p.add_argument("--ours", required=True, help="the built moe_train example")
    p.add_argument("--peer", default=os.path.join(HERE, "peer", "moe_train_torch.py"))
    p.add_argument("--ours-args", default="", help="more arguments for every run of ours (e.g. '--backend cpu')")
    p.add_argument("--peer-args", default="", help="more arguments for every peer run (e.g. '--device cpu')")
    p.add_argument("--config", nargs="+", required=True)
    p.add_argument("--recipes", nargs="*", default=[])
    p.add_argument("--bf16", default=os.path.join(HERE, "..", "recipes", "bf16.json"))
    p.add_argument("--peer-modes", nargs="*", default=["eager", "compile", "fp8"])
    p.add_argument("--seeds", nargs="+", type=int, default=[42])
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--data")
    p.add_argument("--gpus", type=lambda s: [int(g) for g in s.split(",")], default=[0])
    p.add_argument("--jobs-per-gpu", type=int, default=1)
    p.add_argument("--out", required=True)
    args = p.parse_args()
    for sub in ("logs", "peer", "ours"):
        os.makedirs(os.path.join(args.out, sub), exist_ok=True)
    jobs, lines = {"parity": parity, "recipes": recipes, "turns": turns}[args.kind](args)
    for j in failed(jobs):
        lines.append(f"\nFAILED {j.name}: {j.result['error']}\n```\n{j.result['log_tail']}\n```")
    table = "\n".join(lines)
    print(table, flush=True)
    with open(os.path.join(args.out, "table.md"), "w") as f:
        f.write(table + "\n")
    with open(os.path.join(args.out, "runs.json"), "w") as f:
        json.dump([{"name": j.name, "seconds": j.seconds, "result": {k: v for k, v in j.result.items() if k not in ("losses", "aux_losses")}} for j in jobs], f, indent=1)
    sys.exit(1 if failed(jobs) else 0)


if __name__ == "__main__":
    main()
