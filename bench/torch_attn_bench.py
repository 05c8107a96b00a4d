"""Times PyTorch's attention kernels beside `mesanet bench attn --backend cuda`: the peer of the
`mha` and `swa` cores (issue: the Transformer baselines).

Measurement tooling for the comparison only. Run on the GPU machine (torch installed there):

    python3 bench/torch_attn_bench.py [--shape B,T,H,D ...] [--window W]

For each shape (default (8, 2048, 16, 128) and (1, 8192, 16, 128)), bf16, causal, q, k, v laid out
[B, T, H, D] as ours are (SDPA takes them as transposed views, as a model would pass them):

- torch.nn.functional.scaled_dot_product_attention with the flash backend (FlashAttention-2),
  and with cuDNN's fused attention where this torch has it, for reference;
- a sliding window of W tokens (default 1024; the current token and the W - 1 before it): the
  best windowed kernel this torch offers, FlexAttention with a sliding-window block mask (it skips
  the key blocks outside the window; compiled by Triton on first use).

Forward and forward+backward, milliseconds (the median of triton.testing.do_bench's repetitions),
and TFLOP/s counted as FlashAttention counts them (4 B H D x the number of visible (query, key)
pairs forward; 2.5 times that forward+backward).
"""
import argparse
import sys

import torch
import torch.nn.functional as F
import triton
from torch.nn.attention import SDPBackend, sdpa_kernel


def visible_pairs(T, window):
    if window <= 0 or window >= T:
        return T * (T + 1) / 2
    return window * (window + 1) / 2 + (T - window) * window


def timed(fn, backward, q, k, v):
    def fwd():
        return fn(q, k, v)

    if not backward:
        return triton.testing.do_bench(fwd, return_mode="median")
    do = torch.randn_like(q)

    def fb():
        q.grad = k.grad = v.grad = None
        fn(q, k, v).backward(do)

    return triton.testing.do_bench(fb, return_mode="median")


def sdpa(backend):
    def run(q, k, v):  # [B,T,H,D] -> SDPA's [B,H,T,D] views and back
        with sdpa_kernel(backend):
            o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
        return o.transpose(1, 2)

    return run


def flex_window(T, H, window):
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    def mask(b, h, qi, ki):
        return (ki <= qi) & (qi - ki < window)

    block = create_block_mask(mask, None, None, T, T, device="cuda")
    compiled = torch.compile(flex_attention)

    def run(q, k, v):
        return compiled(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), block_mask=block).transpose(1, 2)

    return run


def report(name, B, T, H, D, window, fn):
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(B, T, H, D, device="cuda", dtype=torch.bfloat16, generator=g).requires_grad_() for _ in range(3))
    flops = 4 * B * H * D * visible_pairs(T, window)
    try:
        f = timed(fn, False, q, k, v)
        fb = timed(fn, True, q, k, v)
    except Exception as e:  # a backend this torch or GPU lacks: say so and go on
        print(f"  {name:28s} failed: {type(e).__name__}: {str(e)[:160]}", flush=True)
        return
    print(f"  {name:28s} fwd {f:8.3f} ms ({flops / f / 1e9:6.1f} TFLOP/s)   fwd+bwd {fb:8.3f} ms "
          f"({3.5 * flops / fb / 1e9:6.1f} TFLOP/s)", flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", action="append", help="B,T,H,D (repeatable)")
    ap.add_argument("--window", type=int, default=1024)
    a = ap.parse_args()
    shapes = [tuple(int(x) for x in s.split(",")) for s in a.shape] if a.shape else [(8, 2048, 16, 128),
                                                                                      (1, 8192, 16, 128)]
    if any(len(s) != 4 or min(s) < 1 for s in shapes):
        sys.exit("torch_attn_bench.py: --shape: expected B,T,H,D, four positive integers")
    if a.window < 1:
        sys.exit("torch_attn_bench.py: --window: expected a positive number of tokens")
    print(f"PyTorch attention on {torch.cuda.get_device_name()}, torch {torch.__version__}, bf16, causal")
    for B, T, H, D in shapes:
        print(f"(B, T, H, D) = ({B}, {T}, {H}, {D})")
        report("sdpa flash (full)", B, T, H, D, 0, sdpa(SDPBackend.FLASH_ATTENTION))
        report("sdpa cudnn (full)", B, T, H, D, 0, sdpa(SDPBackend.CUDNN_ATTENTION))
        report(f"flex window {a.window}", B, T, H, D, a.window, flex_window(T, H, a.window))


if __name__ == "__main__":
    main()
