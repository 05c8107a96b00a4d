"""Times fla's Triton Mesa kernels (the peer) at the shapes of `mesanet bench mesa-gpu`.

Measurement tooling for the comparison only; nothing of fla is part of mesanet.
fla's source is not committed: copy its `fla/` folder into `.fla/` (git-ignored)
and run `python3 bench/fla_bench.py` on the GPU machine.

Inputs are drawn as `mesanet bench mesa-gpu` draws them (bf16, L2-normalised q
and k, gates sigmoid(N(3,1)), beta sigmoid(N(0,1)), lambda = 1), timings are the
median of triton.testing.do_bench, and the relative error of o is measured
against the exact float64 solve on the first sequence, first two heads, first
512 tokens.
"""
import os
import sys

os.environ.setdefault("FLA_DISABLE_BACKEND_DISPATCH", "1")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".fla"))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import triton  # noqa: E402
from fla.ops.mesa_net import chunk_mesa_net, mesa_net_decoding_one_step  # noqa: E402


def inputs(B, T, H, D, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    q = F.normalize(torch.randn(B, T, H, D, device="cuda", generator=g), dim=-1).bfloat16()
    k = F.normalize(torch.randn(B, T, H, D, device="cuda", generator=g), dim=-1).bfloat16()
    v = torch.randn(B, T, H, D, device="cuda", generator=g).bfloat16()
    gate = F.logsigmoid(torch.randn(B, T, H, device="cuda", generator=g) + 3).float()
    beta = torch.randn(B, T, H, device="cuda", generator=g).sigmoid().float()
    lamb = torch.ones(H, D, device="cuda")
    return q, k, v, gate, beta, lamb


def exact(q, k, v, gate, beta, lamb, states=None):
    """o_t = G_t (H_t + diag(lambda))^-1 q_t in float64, for (b=0, h<2, t<512); also the final states."""
    T = min(q.shape[1], 512)
    Hn = min(q.shape[2], 2)
    K = q.shape[-1]
    out = torch.zeros(T, Hn, v.shape[-1], dtype=torch.float64, device="cuda")
    final = []
    for h in range(Hn):
        if states is None:
            Hs = torch.zeros(K, K, dtype=torch.float64, device="cuda")
            Gs = torch.zeros(v.shape[-1], K, dtype=torch.float64, device="cuda")
        else:
            Hs, Gs = states[h]
        L = torch.diag(lamb[h].double())
        for t in range(T):
            kt, vt, qt = k[0, t, h].double(), v[0, t, h].double(), q[0, t, h].double()
            gm, bt = gate[0, t, h].double().exp(), beta[0, t, h].double()
            Hs = gm * Hs + bt * torch.outer(kt, kt)
            Gs = gm * Gs + bt * torch.outer(vt, kt)
            out[t, h] = Gs @ torch.linalg.solve(Hs + L, qt)
        final.append((Hs, Gs))
    return (out, final) if states is not None else out


def exact_states(q, k, v, gate, beta, lamb):
    K = q.shape[-1]
    zero = [(torch.zeros(K, K, dtype=torch.float64, device="cuda"),
             torch.zeros(v.shape[-1], K, dtype=torch.float64, device="cuda")) for _ in range(min(q.shape[2], 2))]
    return exact(q, k, v, gate, beta, lamb, zero)[1]


def rel_err(o, ref):
    T, Hn = ref.shape[0], ref.shape[1]
    a = o[0, :T, :Hn].double()
    return ((a - ref).norm() / ref.norm()).item()


def bench_layer(B, T, H, D, steps=30):
    q, k, v, gate, beta, lamb = inputs(B, T, H, D)
    ref = exact(q, k, v, gate, beta, lamb)
    o, _, _ = chunk_mesa_net(q, k, v, gate, beta, lamb, max_CG_iteration=steps)
    err = rel_err(o, ref)
    fwd = triton.testing.do_bench(lambda: chunk_mesa_net(q, k, v, gate, beta, lamb, max_CG_iteration=steps),
                                  return_mode="median")
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v, gate, beta)]
    do = torch.randn_like(v)

    def fwd_bwd():
        o, _, _ = chunk_mesa_net(*leaves, lamb, max_CG_iteration=steps)
        o.backward(do)

    try:
        both = triton.testing.do_bench(fwd_bwd, return_mode="median")
    except Exception as e:  # fla refuses some backwards on some Triton versions
        both = float("nan")
        print(f"  (fwd+bwd failed: {type(e).__name__}: {str(e)[:120]})")
    return fwd, both, err


def bench_decode(B, H=16, D=128, steps=30):
    q, k, v, gate, beta, lamb = inputs(B, 512, H, D, seed=1)
    _, hkk, hkv = chunk_mesa_net(q, k, v, gate, beta, lamb, output_final_state=True, max_CG_iteration=steps)
    q1, k1, v1, g1, b1, _ = inputs(B, 1, H, D, seed=2)
    args = (q1[:, 0], k1[:, 0], v1[:, 0], g1[:, 0], lamb, b1[:, 0], hkk, hkv)
    o1 = mesa_net_decoding_one_step(*args, max_CG_iteration=steps)[0]
    ref, _ = exact(q1, k1, v1, g1, b1, lamb, exact_states(q, k, v, gate, beta, lamb))
    err = rel_err(o1[:, None], ref)
    ms = triton.testing.do_bench(lambda: mesa_net_decoding_one_step(*args, max_CG_iteration=steps),
                                 return_mode="median")
    return ms, err


def main():
    only_decode, no_decode = "--decode-only" in sys.argv, "--no-decode" in sys.argv
    print(f"fla Mesa kernels on {torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}")
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    ms = triton.testing.do_bench(lambda: a @ a, return_mode="median")
    print(f"bf16 matrix product 8192^3: {2 * 8192**3 / ms / 1e9:.0f} TFLOP/s")
    print(f"{'B x T x H x D':16s} {'CG':9s} | {'fwd ms':>9s} | {'f+b ms':>9s} | {'rel err':>9s}")
    for B, T, H, D in [] if only_decode else [(8, 2048, 16, 128), (4, 4096, 16, 128), (16, 2048, 8, 64)]:
        fwd, both, err = bench_layer(B, T, H, D)
        print(f"{f'{B}x{T}x{H}x{D}':16s} {'30 steps':9s} | {fwd:9.3f} | {both:9.3f} | {err:9.2e}", flush=True)
    if not no_decode:
        print("\ndecode step (H=16, D=128, 30 CG steps, after a 512-token prefill; rel err of the first step):")
    for B in () if no_decode else (1, 16, 128):
        ms, err = bench_decode(B)
        print(f"{B:6d} | {ms:10.3f} ms/token {B / ms * 1e3:12.0f} tokens/s | {err:9.2e}", flush=True)


if __name__ == "__main__":
    main()
