"""What the scan peers' timing scripts (hgrn_bench.py, longhorn_scan_bench.py) share: the BxTxC shapes
of `mesanet bench scan --shapes` and the device copy rate that their "% copy" columns are over."""
import torch


def parse_shapes(s):
    out = []
    for part in s.split(","):
        b, t, c = (int(v) for v in part.split("x"))
        if min(b, t, c) < 1:
            raise ValueError(part)
        out.append((b, t, c))
    return out


def copy_gbs(timer):
    """A copy of 1 GiB of bf16 (read + write) timed by timer(fn) -> ms: (GB/s, ms)."""
    n = 1 << 29
    src = torch.empty(n, dtype=torch.bfloat16, device="cuda")
    dst = torch.empty_like(src)
    ms = timer(lambda: dst.copy_(src))
    del src, dst
    return 2 * 2 * n / (ms * 1e-3) / 1e9, ms
