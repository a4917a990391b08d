"""Timing shared by the PyTorch peers, as benches/common/timing.rs times our side: wall clock around
back-to-back calls between two device synchronizations."""
import time

import torch


def timed(fn, iterations):
    """Seconds per call: the best of three timed runs of `iterations` calls after three warm-up
    calls (compilation, algorithm choice)."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        for _ in range(iterations):
            fn()
        torch.cuda.synchronize()
        best = min(best, (time.perf_counter() - start) / iterations)
    return best


def one_run(fn, iterations):
    """Seconds per call of one timed run of `iterations` calls, between two device
    synchronizations (a peer's side of a turn, `benches/turns.py`)."""
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(iterations):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / iterations


def host_time(fn, iterations):
    """Host seconds per call: the enqueue loop before the device is synchronized."""
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(iterations):
        fn()
    host = (time.perf_counter() - start) / iterations
    torch.cuda.synchronize()
    return host
