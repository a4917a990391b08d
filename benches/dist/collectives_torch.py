"""The PyTorch peer of `examples/dist_bandwidth.rs`: torch.distributed's all_to_all_single (even
splits) and all_reduce (f32 sum) on NCCL, the same sizes, warm-up and iteration counts, timed the
same way (host synchronisation around 20 calls). Run with torchrun:

    torchrun --nproc-per-node 4 benches/dist/collectives_torch.py
"""
import os
import time

import torch
import torch.distributed as dist

WARMUP, ITERS = 5, 20
SIZES = [16 << 20, 64 << 20, 256 << 20, 1 << 30]


def main():
    local = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local))
    n, rank = dist.get_world_size(), dist.get_rank()
    if rank == 0:
        print("| collective | ranks | MiB a rank | ms a call | algorithm GB/s | bus GB/s |")
        print("|---|---|---|---|---|---|")
    for size in SIZES:
        size = size // n * n
        send = torch.empty(size, dtype=torch.uint8, device="cuda")
        recv = torch.empty_like(send)
        f32 = send.view(torch.float32)

        def timed(call):
            for _ in range(WARMUP):
                call()
            torch.cuda.synchronize()
            start = time.perf_counter()
            for _ in range(ITERS):
                call()
            torch.cuda.synchronize()
            return (time.perf_counter() - start) / ITERS

        a2a = timed(lambda: dist.all_to_all_single(recv, send))
        ar = timed(lambda: dist.all_reduce(f32))
        if rank == 0:
            for name, secs, factor in [("all-to-all", a2a, (n - 1) / n), ("all-reduce f32", ar, 2 * (n - 1) / n)]:
                algbw = size / secs / 1e9
                print(f"| {name} (torch) | {n} | {size / 2**20:.0f} | {secs * 1e3:.3f} | {algbw:.1f} | {algbw * factor:.1f} |")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
