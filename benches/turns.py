"""Turn-taking between one of our CUDA benches and its PyTorch peer (`timing::time_in_turns`,
`timing::time_rounds` on the Rust side).

The bench runs with LOWP_BENCH_TURNS=1 and, before each of its timed runs (or rounds), prints
`{"turn": case, "run": r}` and waits for a line on stdin. The peer times its own run of that case
and answers, so the two sides alternate in the same power and thermal state of the GPU: an H100
running BF16 GEMMs back to back drops its clock at the power limit within a second, so a process
timed after another meets a hotter GPU and the first run after a pause a cooler one. Run 0 heats
the GPU on both sides and is not counted (`counted`)."""
import json
import os
import subprocess


def counted(run):
    """Whether a turn's run counts (run 0 only heats the GPU)."""
    return run > 0


def run_in_turns(command, time_peer, env=None):
    """Runs `command` (the bench and its arguments) taking turns: `time_peer(case, run)` runs on
    every turn, then the bench goes on. Yields every other line the bench prints, parsed where it
    is JSON (dicts) and as text otherwise; a bench that fails ends with an `error` line.""" 
    full_env = dict(os.environ, LOWP_BENCH_TURNS="1", **(env or {}))
    child = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                             env=full_env, bufsize=1)
    for raw in child.stdout:
        line = raw.strip()
        if not line.startswith("{"):
            yield line
            continue
        o = json.loads(line)
        if "turn" in o:
            time_peer(o["turn"], o["run"])
            child.stdin.write("go\n")
            child.stdin.flush()
            continue
        yield o
    if child.wait() != 0:
        yield {"bench": "turns", "error": f"{command[0]} exited with status {child.returncode}"}
