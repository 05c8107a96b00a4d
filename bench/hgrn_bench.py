"""Times fla's HGRN kernels (the peer of `mesanet bench scan`'s RG-LRU rows): chunk_hgrn and
fused_recurrent_hgrn, o_t = exp(g_t) o_{t-1} + x_t over [B, T, C] in bf16, at the same BxTxC shapes,
forward and forward+backward, against a device copy measured in the same run, and prints the same
table as `mesanet bench scan`.

Measurement tooling for the comparison only; nothing of fla is part of mesanet. fla's source is not
committed: copy its `fla/` folder into `.fla/` (git-ignored; bench/scan_peers.sh says how) and run
`python3 bench/hgrn_bench.py` on the GPU machine. FLA_DISABLE_BACKEND_DISPATCH=1 is set (fla's own
Triton kernels, not a dispatch to another backend).

Timing: triton.testing.do_bench's median (ms). The bytes counted are those a call must move at least,
as bench scan counts ours: the forward reads x and g and writes o (6 bytes a (b, t, c)); the backward
reads g, o and do and writes dx and dg (10: 16 in all for forward+backward). "% copy" is over a bf16
copy of 1 GiB (read + write) timed by do_bench.

Inputs: x uniform in [-1, 1), g = log sigmoid(U(0, 6)) (forget gates in 0.5 .. 0.998), do uniform.

Options: --shapes BxTxC,... (default 8x2048x2048,16x4096x1536), --kernels chunk,fused_recurrent.
"""
import argparse
import os
import sys

os.environ.setdefault("FLA_DISABLE_BACKEND_DISPATCH", "1")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".fla"))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import triton  # noqa: E402

from fla.ops.hgrn import chunk_hgrn, fused_recurrent_hgrn  # noqa: E402
from scan_bench_common import copy_gbs, parse_shapes  # noqa: E402

KERNELS = {"chunk": chunk_hgrn, "fused_recurrent": fused_recurrent_hgrn}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", default="8x2048x2048,16x4096x1536")
    ap.add_argument("--kernels", default="chunk,fused_recurrent")
    a = ap.parse_args()
    shapes = parse_shapes(a.shapes)
    kernels = [k for k in a.kernels.split(",") if k]
    for k in kernels:
        if k not in KERNELS:
            sys.exit(f"--kernels: unknown kernel {k!r} (chunk, fused_recurrent)")
    gbs, cms = copy_gbs(lambda f: triton.testing.do_bench(f, return_mode="median"))
    print(f"device copy: {gbs:.1f} GB/s (1 GiB bf16, read + write, {cms:.3f} ms)\n")
    print(f"{'kind':<22} {'B x T x C':<16} | {'fwd ms':>9} {'GB/s':>8} {'% copy':>7} | {'f+b ms':>9} {'GB/s':>8} "
          f"{'% copy':>7} | finite")
    for name in kernels:
        fn = KERNELS[name]
        for B, T, C in shapes:
            gen = torch.Generator(device="cuda").manual_seed(0)
            x = (torch.rand(B, T, C, device="cuda", generator=gen) * 2 - 1).bfloat16()
            g = F.logsigmoid(torch.rand(B, T, C, device="cuda", generator=gen) * 6).bfloat16()
            do = (torch.rand(B, T, C, device="cuda", generator=gen) * 2 - 1).bfloat16()
            xl, gl = x.clone().requires_grad_(True), g.clone().requires_grad_(True)

            def fwd():
                return fn(x, g)[0]

            def fwd_bwd():
                xl.grad = gl.grad = None
                fn(xl, gl)[0].backward(do)

            tf = triton.testing.do_bench(fwd, return_mode="median")
            tb = triton.testing.do_bench(fwd_bwd, return_mode="median")
            fin = bool(torch.isfinite(fwd()).all() and torch.isfinite(xl.grad).all() and torch.isfinite(gl.grad).all())
            n = B * T * C
            bf, bb = 6.0 * n, 16.0 * n
            print(f"{'fla ' + name + '_hgrn':<22} {f'{B}x{T}x{C}':<16} | {tf:9.3f} {bf / tf / 1e6:8.0f} "
                  f"{100 * bf / tf / 1e6 / gbs:6.1f}% | {tb:9.3f} {bb / tb / 1e6:8.0f} "
                  f"{100 * bb / tb / 1e6 / gbs:6.1f}% | {'yes' if fin else 'NO'}", flush=True)
            del x, g, do, xl, gl
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
