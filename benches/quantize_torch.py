"""PyTorch peer for benches/quantize.rs: the same quantizers written in plain PyTorch, timed on the
same GPU, eager and torch.compile, printed as JSON lines with the same byte accounting
(input bytes + output bytes) / time and the ratio to a device copy (x.clone()) measured in the
same run.

    python3 benches/quantize_torch.py [--shapes 16384x8192,4096x4096] [--no-compile]
"""
import argparse
import json

import torch

FP8 = torch.float8_e4m3fn
F8_MAX = 448.0


def fp8_current(x, rowwise, columnwise):
    amax = x.abs().amax().float()
    scale = torch.where(amax > 0, F8_MAX / amax, torch.ones_like(amax))
    q = (x.float() * scale).clamp(-F8_MAX, F8_MAX).to(FP8)
    out = [1.0 / scale]
    if rowwise:
        out.append(q)
    if columnwise:
        out.append(q.t().contiguous())
    return out


KNOWN_SCALE = torch.tensor(0.5, device="cuda")


def fp8_scale(x, rowwise, columnwise):
    """FP8 cast with a known scale (delayed scaling): no amax pass."""
    q = (x.float() * KNOWN_SCALE).clamp(-F8_MAX, F8_MAX).to(FP8)
    out = []
    if rowwise:
        out.append(q)
    if columnwise:
        out.append(q.t().contiguous())
    return out


def fp8_block_1x128(x, rowwise, columnwise):
    def rows(t):
        m, k = t.shape
        b = t.float().view(m, k // 128, 128)
        amax = b.abs().amax(-1, keepdim=True)
        scale = torch.where(amax > 0, F8_MAX / amax, torch.ones_like(amax))
        scale = torch.exp2(torch.floor(torch.log2(scale)))  # power-of-two scales
        return (b * scale).clamp(-F8_MAX, F8_MAX).to(FP8).view(m, k), 1.0 / scale
    out = []
    if rowwise:
        out += rows(x)
    if columnwise:
        out += rows(x.t())
    return out


def mx_blocks(b):
    # b: [..., 32] float; E8M0 = ceil(log2(amax / 448)) as a biased byte, elements scaled by 2^-e.
    amax = b.abs().amax(-1, keepdim=True)
    e = torch.ceil(torch.log2(torch.clamp(amax / F8_MAX, min=2.0 ** -127)))
    q = (b * torch.exp2(-e)).clamp(-F8_MAX, F8_MAX).to(FP8)
    return q, (e + 127).to(torch.uint8)


def mxfp8(x, rowwise, columnwise):
    m, k = x.shape
    out = []
    if rowwise:
        q, s = mx_blocks(x.float().view(m, k // 32, 32))
        out += [q.view(m, k), s]
    if columnwise:
        q, s = mx_blocks(x.float().view(m // 32, 32, k).transpose(1, 2))
        out += [q.transpose(1, 2).reshape(m, k), s]
    return out


E2M1_BOUNDS = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])


def nvfp4_rows(t, bounds):
    m, k = t.shape
    amax = t.abs().amax().float()
    s_enc = torch.where(amax > 0, 2688.0 / amax, torch.ones_like(amax))
    b = t.float().view(m, k // 16, 16)
    s_b = (b.abs().amax(-1, keepdim=True) * (s_enc / 6.0)).clamp(max=448.0).to(FP8)
    enc = 1.0 / (s_b.float() / s_enc)
    v = (b * enc).clamp(-6.0, 6.0)
    code = torch.bucketize(v.abs(), bounds, right=False).to(torch.uint8) | ((v < 0).to(torch.uint8) << 3)
    code = code.view(m, k // 2, 2)
    return (code[..., 0] | (code[..., 1] << 4)), s_b


def nvfp4(x, rowwise, columnwise):
    bounds = E2M1_BOUNDS.to(x.device)
    out = []
    if rowwise:
        out += nvfp4_rows(x, bounds)
    if columnwise:
        out += nvfp4_rows(x.t(), bounds)
    return out


FORMATS = {
    "fp8-e4m3-current": (fp8_current, lambda n: n),
    "fp8-e4m3-scale": (fp8_scale, lambda n: n),
    "fp8-block-1x128": (fp8_block_1x128, lambda n: n + n // 128 * 4),
    "mxfp8-e4m3": (mxfp8, lambda n: n + n // 32),
    "nvfp4": (nvfp4, lambda n: n // 2 + n // 16),
}
USAGES = {"rowwise": (True, False), "columnwise": (False, True), "both": (True, True)}


def timed(fn, iterations):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iterations):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / 1e3 / iterations


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--shapes", default="16384x8192,4096x4096")
    parser.add_argument("--no-compile", action="store_true")
    parser.add_argument("--formats", default="", help="comma-separated format names (default: all)")
    args = parser.parse_args()
    formats = {name: f for name, f in FORMATS.items() if not args.formats or name in args.formats.split(",")}
    torch.manual_seed(0)
    for shape in args.shapes.split(","):
        m, k = (int(v) for v in shape.split("x"))
        x = (torch.randn(m, k, device="cuda") * 2).to(torch.bfloat16)
        n = m * k
        iterations = 20 if n > 50_000_000 else 100
        copy_s = timed(lambda: x.clone(), iterations)
        copy_gbps = 2 * 2 * n / copy_s / 1e9
        print(json.dumps({"bench": "torch-copy", "shape": [m, k], "dtype": "bf16", "time_us": round(copy_s * 1e6, 1), "gbps": round(copy_gbps, 1)}), flush=True)
        for name, (fn, out_bytes) in formats.items():
            for usage, (row, col) in USAGES.items():
                modes = [("eager", fn)] if args.no_compile else [("eager", fn), ("compile", torch.compile(fn, dynamic=False))]
                for mode, f in modes:
                    s = timed(lambda: f(x, row, col), iterations)
                    nbytes = 2 * n + (row + col) * out_bytes(n)
                    gbps = nbytes / s / 1e9
                    print(json.dumps({"bench": "torch-quantize", "mode": mode, "format": name, "usage": usage, "shape": [m, k],
                                      "dtype": "bf16", "time_us": round(s * 1e6, 1), "gbps": round(gbps, 1),
                                      "copy_gbps": round(copy_gbps, 1), "ratio_to_copy": round(gbps / copy_gbps, 3)}), flush=True)


if __name__ == "__main__":
    main()
