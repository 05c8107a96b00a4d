"""Times the official Longhorn scan (the peer of `mesanet bench scan`'s longhorn rows) at the same
BxTxC shapes, d_state 16, forward and forward+backward, and prints the same table.

Which official scan: Cranial-XIX/longhorn_cuda's CUDA extension (online_selective_scan_cuda) where it
is importable, else its PyTorch reference selective_scan_online7_ref (a loop over time in float32,
autograd for the backward); the table's first column says which ran. The CUDA extension needs
building with torch's extension tools from the full repository (csrc/), which takes longer than a
device call; on the lent machine the reference runs.

Measurement tooling for the comparison only; nothing of the official code is part of mesanet. Its
source stays in the git-ignored .peers/ (bench/longhorn_check.py says which files); run on the GPU
machine:

    python3 bench/longhorn_scan_bench.py [--shapes 8x2048x2048,16x4096x1536] [--peers .peers]

Timing: the median of --reps calls (CUDA events) after one warm-up call; the bytes counted are the
ones bench scan counts for ours (x, delta, y, k, q in bf16: the reference itself moves far more).
Inputs: x, delta, k, q uniform in [-1, 1), D and the bias uniform too.
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402

import longhorn_check  # noqa: E402  (its stand-ins let the official files load without their packages)
from scan_bench_common import copy_gbs, parse_shapes  # noqa: E402

N = 16


def official_scan(peers):
    try:
        import online_selective_scan_cuda  # noqa: F401
        longhorn_check.load_official(peers)
        iface = sys.modules["longhorn_official_interface"]
        return "official CUDA", lambda *a: iface.selective_scan_online7_fn(*a)
    except ImportError:
        longhorn_check.load_official(peers)
        iface = sys.modules["longhorn_official_interface"]
        return "official ref", iface.selective_scan_online7_ref


def timed(fn, reps):
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b))
    return sorted(times)[len(times) // 2]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", default="8x2048x2048,16x4096x1536")
    ap.add_argument("--peers", default=".peers")
    ap.add_argument("--reps", type=int, default=3)
    a = ap.parse_args()
    name, scan = official_scan(a.peers)
    copy, _ = copy_gbs(lambda f: timed(f, 5))
    print(f"device copy: {copy:.1f} GB/s (1 GiB bf16, read + write)")
    print(f"\n{'kind':22s} {'B x T x C':16s} | {'fwd ms':>9s} {'GB/s':>8s} {'% copy':>7s} | "
          f"{'f+b ms':>9s} {'GB/s':>8s} {'% copy':>7s} | finite")
    g = torch.Generator(device="cuda").manual_seed(0)
    for B, T, C in parse_shapes(a.shapes):
        def u(*shape):
            return (torch.rand(*shape, generator=g, device="cuda") * 2 - 1).to(torch.bfloat16)
        x, dt = u(B, C, T), u(B, C, T)
        k, q = u(B, N, T), u(B, N, T)
        D, bias = u(C).float(), u(C).float()
        dy = u(B, C, T)
        fwd = timed(lambda: scan(x, q, k, dt, D, bias), a.reps)
        xs, dts, ks, qs = (t.detach().clone().requires_grad_(True) for t in (x, dt, k, q))

        def fb():
            for t in (xs, dts, ks, qs):
                t.grad = None
            y = scan(xs, qs, ks, dts, D, bias)
            y.backward(dy.to(y.dtype))
        fb_ms = timed(fb, a.reps)
        y = scan(x, q, k, dt, D, bias)
        ok = bool(torch.isfinite(y).all())
        nf = B * T * C * 6 + 2 * B * T * N * 2  # as bench scan counts ours
        nb = B * T * C * 16 + 4 * B * T * N * 2
        print(f"{name:22s} {f'{B}x{T}x{C}':16s} | {fwd:9.3f} {nf / fwd / 1e6:8.0f} {100 * nf / fwd / 1e6 / copy:6.1f}% | "
              f"{fb_ms:9.3f} {nb / fb_ms / 1e6:8.0f} {100 * nb / fb_ms / 1e6 / copy:6.1f}% | {'yes' if ok else 'NO'}",
              flush=True)


if __name__ == "__main__":
    main()
