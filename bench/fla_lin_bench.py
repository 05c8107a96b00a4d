"""Times fla's Triton kernels of the gated linear-attention family (the peer) at the shapes of
`mesanet bench lin --backend cuda`, and prints the same table.

Measurement tooling for the comparison only; nothing of fla is part of mesanet.
fla's source is not committed: copy its `fla/` folder into `.fla/` (git-ignored)
and run `python3 bench/fla_lin_bench.py` on the GPU machine.

Variants, as `mesanet bench lin` names them (scale 1, as mesanet's mixers):
    gdn       chunk_gated_delta_rule(q, k, v, g, beta)
    deltanet  chunk_delta_rule(q, k, v, beta)
    gla       chunk_simple_gla(q, k, v * beta, g)   (the GLA rule with beta: beta folded into v)
    mamba2    chunk_simple_gla(q, k, v, g)
Decode: fused_recurrent_gated_delta_rule (gdn; deltanet with g = None) and
fused_recurrent_simple_gla (gla, mamba2), one token for B sequences with their
states after a 512-token prefill, H = 16, D = 128.

Inputs are drawn as `mesanet bench lin` draws them: bf16 q and k, L2-normalised
here (use_qk_l2norm_in_kernel off), bf16 v and dout ~ N(0, 1), float32
g = log sigmoid(N(3, 1)) and beta = sigmoid(N(0, 1)). The relative L2 errors of
o, dq, dk and dv are against a float64 torch recurrence on the same inputs
(first sequence, first two heads, all tokens), as bench lin's against mesanet's
float64 reference.

Timing, as bench lin's columns: "fwd ms" and "f+b ms" are the median of single
calls timed on the host from launch to completion after a synchronisation;
"f+b strm" is triton.testing.do_bench's median (as bench/fla_bench.py times).
A second table gives do_bench's forward and forward+backward. The decode step:
do_bench's median. Memory: the device memory in use (total less free) after the f+b.

fla's gated backward (chunk_bwd_dqkwg with g, used by gdn, gla and mamba2)
refuses to run on Hopper with Triton >= 3.4.0 and < 3.7.1, where its gradients
are known to be wrong (fla issue 640). This script bypasses that guard (it sets
the module's IS_NVIDIA_HOPPER to False, leaving .fla as it is) so that the time
can be measured, and says so: the error columns then show how wrong they are.

Options: --shapes BxTxHxD,... (default 8x2048x16x128,16x2048x8x64),
--variants gdn,deltanet,gla,mamba2, --decode 1,16,128 (or "" for none),
--reps N (host-timed repetitions, default 10), --gmean G (default 3).
--hard: instead, the errors of o, dq, dk, dv, dg, dbeta on the hard inputs of
`mesanet bench lin --hard` (B 1, H 2, D 64, T 500: no decay over 1000 tokens,
one key for every token, beta in [1.9, 2), the last two together), inputs of
the same law as its, not the same draws.
"""
import argparse
import os
import sys
import time

os.environ.setdefault("FLA_DISABLE_BACKEND_DISPATCH", "1")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".fla"))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import triton  # noqa: E402

import fla.ops.common.chunk_o as fla_chunk_o  # noqa: E402
import fla.utils as fla_utils  # noqa: E402
from fla.ops.delta_rule import chunk_delta_rule  # noqa: E402
from fla.ops.gated_delta_rule import chunk_gated_delta_rule, fused_recurrent_gated_delta_rule  # noqa: E402
from fla.ops.simple_gla import chunk_simple_gla, fused_recurrent_simple_gla  # noqa: E402

# variant: (delta rule, gated, beta)
VARIANTS = {"gdn": (True, True, True), "deltanet": (True, False, True), "gla": (False, True, True),
            "mamba2": (False, True, False)}


def hopper_guard_bypassed():
    """Lifts fla's guard of issue 640 where it would fire; True if it did."""
    def flag(name, default):  # the names the guard reads: chunk_o's own imports of fla.utils' flags
        return getattr(fla_chunk_o, name, getattr(fla_utils, name, default))
    fires = flag("IS_NVIDIA_HOPPER", False) and flag("TRITON_ABOVE_3_4_0", False) and not flag("TRITON_ABOVE_3_7_1", True)
    if fires:
        fla_chunk_o.IS_NVIDIA_HOPPER = False  # read at call time by chunk_bwd_dqkwg's check only
    return fires


def inputs(B, T, H, D, seed=0, gmean=3.0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    q = F.normalize(torch.randn(B, T, H, D, device="cuda", generator=g), dim=-1).bfloat16()
    k = F.normalize(torch.randn(B, T, H, D, device="cuda", generator=g), dim=-1).bfloat16()
    v = torch.randn(B, T, H, D, device="cuda", generator=g).bfloat16()
    gate = F.logsigmoid(torch.randn(B, T, H, device="cuda", generator=g) + gmean).float()
    beta = torch.randn(B, T, H, device="cuda", generator=g).sigmoid().float()
    dout = torch.randn(B, T, H, D, device="cuda", generator=g).bfloat16()
    return q, k, v, gate, beta, dout


HARD_KINDS = ["g = 0, T = 1000", "one key", "beta in [1.9, 2)", "beta ~2, one key"]


def hard_inputs(kind, seed):
    """bench lin --hard's inputs of a kind: (1, T, 2, 64), g = 0 / one key / beta in [1.9, 2) / both last."""
    q, k, v, gate, beta, dout = inputs(1, 1000 if kind == 0 else 500, 2, 64, seed)
    if kind == 0:
        gate = torch.zeros_like(gate)
    if kind in (1, 3):
        k = k[:, :1, :1].expand_as(k).contiguous()
    if kind >= 2:
        g = torch.Generator(device="cuda").manual_seed(seed + 1)
        beta = 1.9 + 0.1 * torch.rand(beta.shape, device="cuda", generator=g)
    return q, k, v, gate, beta, dout


def hard_errors(variant, kind, seed):
    """The relative errors of o, dq, dk, dv, dg, dbeta (nan where the variant has no such input) on one kind."""
    q, k, v, gate, beta, dout = hard_inputs(kind, seed)
    Hn = q.shape[2]
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v, gate, beta)]
    o = call(variant, *leaves)
    o.backward(dout)
    exact = [first(x, Hn).requires_grad_(True) for x in (q, k, v, gate, beta)]
    eo, _ = recurrence(variant, *exact)
    eo.backward(first(dout, Hn))
    errs = [rel(first(o.detach(), Hn), eo.detach())]
    for got, want in zip(leaves, exact):
        ok = got.grad is not None and want.grad is not None
        errs.append(rel(first(got.grad, Hn), want.grad) if ok else float("nan"))
    return errs


def run_hard(variants):
    print(f"fla on the hard inputs, {torch.cuda.get_device_name()}, triton {triton.__version__} (B 1, H 2, D 64; T 500, "
          "or 1000 where g = 0): rel err against float64, every token and head")
    print(f"{'inputs':18s} {'variant':9s} | {'err o':>9s} {'err dq':>9s} {'err dk':>9s} {'err dv':>9s} {'err dg':>9s} "
          f"{'err dbeta':>9s}")
    for kind, name in enumerate(HARD_KINDS):
        for var in variants:
            delta, gated, has_beta = VARIANTS[var]
            if (kind == 0 and not gated) or (kind >= 2 and not (delta and has_beta)):
                continue
            try:
                e = hard_errors(var, kind, 31 + kind)
            except Exception as ex:  # noqa: BLE001 (one failing kernel leaves the others' rows)
                print(f"{name:18s} {var:9s} | failed: {type(ex).__name__}: {str(ex)[:160]}", flush=True)
                continue
            print(f"{name:18s} {var:9s} | " + " ".join(f"{x:9.2e}" for x in e), flush=True)


def call(variant, q, k, v, gate, beta):
    """fla's chunkwise kernel of the variant: o [B,T,H,D]."""
    if variant == "gdn":
        return chunk_gated_delta_rule(q, k, v, gate, beta, scale=1.0, use_qk_l2norm_in_kernel=False)[0]
    if variant == "deltanet":
        return chunk_delta_rule(q, k, v, beta, scale=1.0, use_qk_l2norm_in_kernel=False)[0]
    if variant == "gla":
        return chunk_simple_gla(q, k, (v * beta[..., None]).to(v.dtype), gate, scale=1.0)[0]
    return chunk_simple_gla(q, k, v, gate, scale=1.0)[0]


def recurrence(variant, q, k, v, gate, beta, S=None):
    """float64 recurrence on [T,Hn,D] slices (mesanet's src/ref/lin_ref.c): o [T,Hn,D] and the final S [Hn,Dv,Dk]."""
    delta, gated, has_beta = VARIANTS[variant]
    T, Hn, Dk = q.shape
    Dv = v.shape[-1]
    if S is None:
        S = torch.zeros(Hn, Dv, Dk, dtype=torch.float64, device=q.device)
    outs = []
    for t in range(T):
        kt, vt, qt = k[t], v[t], q[t]
        P = S * gate[t].exp()[:, None, None] if gated else S
        bt = beta[t][:, None] if has_beta else 1.0
        if delta:
            u = bt * (vt - torch.einsum("hvk,hk->hv", P, kt))
        else:
            u = bt * vt
        S = P + u[:, :, None] * kt[:, None, :]
        outs.append(torch.einsum("hvk,hk->hv", S, qt))
    return torch.stack(outs), S


def first(x, Hn):
    return x[0, :, :Hn].double()


def rel(a, e):
    a = a.double()
    return ((a - e).norm() / e.norm()).item()


def exact_grads(variant, q, k, v, gate, beta, dout, Hn):
    """o, dq, dk, dv in float64 on (b = 0, h < Hn, all tokens)."""
    leaves = [first(x, Hn).requires_grad_(True) for x in (q, k, v)]
    o, _ = recurrence(variant, *leaves, first(gate, Hn), first(beta, Hn))
    o.backward(first(dout, Hn))
    return o.detach(), leaves[0].grad, leaves[1].grad, leaves[2].grad


def host_median(fn, reps):
    fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        ts.append(time.perf_counter() - t0)
    ts.sort()
    n = len(ts)
    return 1e3 * (ts[n // 2] if n % 2 else 0.5 * (ts[n // 2 - 1] + ts[n // 2]))


def mem_gb():
    free, total = torch.cuda.mem_get_info()
    return (total - free) / 1e9


def fwd_flops_per_token(delta, C, Dk, Dv):
    """Minimal flops of the chunkwise forward per token and head, as bench/bench_lin.c counts them."""
    kv = Dk * Dv
    f = 4 * kv + C * (Dk + Dv)
    if delta:
        f += 2 * kv + C * Dk + C * (Dk + Dv) + C * C / 3
    return f


def bench_layer(variant, B, T, H, D, reps, gmean, seed):
    q, k, v, gate, beta, dout = inputs(B, T, H, D, seed, gmean)
    fwd = host_median(lambda: call(variant, q, k, v, gate, beta), reps)
    fwd_db = triton.testing.do_bench(lambda: call(variant, q, k, v, gate, beta), return_mode="median")
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v, gate, beta)]

    def fwd_bwd():
        for t in leaves:
            t.grad = None
        call(variant, *leaves).backward(dout)

    both = host_median(fwd_bwd, reps)
    strm = triton.testing.do_bench(fwd_bwd, return_mode="median")
    mem = mem_gb()
    # errors of one more call, from fresh gradients
    fwd_bwd()
    Hn = min(H, 2)
    eo, edq, edk, edv = exact_grads(variant, q, k, v, gate, beta, dout, Hn)
    o = call(variant, q, k, v, gate, beta)
    errs = (rel(first(o, Hn), eo), rel(first(leaves[0].grad, Hn), edq), rel(first(leaves[1].grad, Hn), edk),
            rel(first(leaves[2].grad, Hn), edv))
    flops = B * T * H * fwd_flops_per_token(VARIANTS[variant][0], 64, D, D)
    return fwd, both, strm, errs, mem, flops / (fwd * 1e-3) / 1e12, fwd_db


def bench_decode(variant, B, gmean, H=16, D=128, T0=512):
    delta, gated, has_beta = VARIANTS[variant]
    q, k, v, gate, beta, _ = inputs(B, T0, H, D, 5, gmean)
    q1, k1, v1, g1, b1, _ = inputs(B, 1, H, D, 6, gmean)
    if delta:
        if gated:
            _, s = chunk_gated_delta_rule(q, k, v, gate, beta, scale=1.0, output_final_state=True)
        else:
            _, s = chunk_delta_rule(q, k, v, beta, scale=1.0, output_final_state=True)

        def step():
            return fused_recurrent_gated_delta_rule(q1, k1, v1, g1 if gated else None, beta=b1, scale=1.0,
                                                    initial_state=s, output_final_state=True)[0]
    else:
        vv = (v * beta[..., None]).to(v.dtype) if has_beta else v
        v1b = (v1 * b1[..., None]).to(v1.dtype) if has_beta else v1
        _, s = chunk_simple_gla(q, k, vv, gate, scale=1.0, output_final_state=True)

        def step():
            return fused_recurrent_simple_gla(q1, k1, v1b, g1, scale=1.0, initial_state=s,
                                              output_final_state=True)[0]
    o1 = step()
    Hn = 2
    with torch.no_grad():
        _, S = recurrence(variant, first(q, Hn), first(k, Hn), first(v, Hn), first(gate, Hn), first(beta, Hn))
        e1, _ = recurrence(variant, first(q1, Hn), first(k1, Hn), first(v1, Hn), first(g1, Hn), first(b1, Hn), S)
    err = rel(first(o1, Hn), e1)
    ms = triton.testing.do_bench(step, return_mode="median")
    return ms, err


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", default="8x2048x16x128,16x2048x8x64")
    ap.add_argument("--variants", default="gdn,deltanet,gla,mamba2")
    ap.add_argument("--decode", default="1,16,128")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--gmean", type=float, default=3.0)
    ap.add_argument("--hard", action="store_true")
    a = ap.parse_args()
    shapes = [tuple(int(x) for x in s.split("x")) for s in a.shapes.split(",") if s]
    variants = [x for x in a.variants.split(",") if x]
    for x in variants:
        if x not in VARIANTS:
            sys.exit(f"--variants: unknown '{x}' (gdn, deltanet, gla, mamba2)")
    decode = [int(x) for x in a.decode.split(",") if x]
    if a.hard:
        if hopper_guard_bypassed():
            print("WARNING: fla's gated backward is known wrong on this Hopper + Triton (issue 640); its guard is "
                  "bypassed here, so gdn / gla / mamba2 gradients may be wrong for that reason")
        run_hard(variants)
        return
    if a.reps < 1 or any(len(s) != 4 or min(s) < 1 for s in shapes) or any(b < 1 for b in decode):
        sys.exit("--reps >= 1, --shapes BxTxHxD with positive sizes, --decode positive batch sizes")

    print(f"fla gated linear-attention kernels on {torch.cuda.get_device_name()}, torch {torch.__version__}, "
          f"triton {triton.__version__}; bf16 q k v (q, k L2-normalised outside the kernel), scale 1")
    if hopper_guard_bypassed():
        print("WARNING: Hopper with Triton >= 3.4.0 and < 3.7.1: fla refuses its gated backward here (issue 640: "
              "known wrong gradients);\n  this script bypasses that check, so gdn / gla / mamba2 f+b are timed, "
              "but their gradients here are KNOWN TO BE WRONG (see err dq dk dv)")
    m = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    ms = triton.testing.do_bench(lambda: m @ m, return_mode="median")
    del m
    torch.cuda.empty_cache()  # the memory column counts what torch's allocator holds
    print("(each kernel's first call at a shape compiles and autotunes it: the first run takes minutes)", file=sys.stderr)
    print(f"bf16 matrix product 8192^3 in the same run: {2 * 8192**3 / ms / 1e9:.0f} TFLOP/s")
    print("TFLOP/s: minimal flops of the chunkwise form (C = 64; bench/bench_lin.c) / fwd time; rel err: o, dq, dk, dv "
          "against float64 on b = 0, h < 2, all tokens;\nfwd ms, f+b ms: host-timed single calls; f+b strm: "
          "triton.testing.do_bench; mem: device memory in use after the f+b")
    print(f"{'B x T x H x D':16s} {'variant':9s} | {'fwd ms':>9s} {'TFLOP/s':>8s} | {'f+b ms':>9s} {'f+b strm':>9s} | "
          f"{'err o':>9s} {'err dq':>9s} {'err dk':>9s} {'err dv':>9s} | {'mem GB':>7s}")
    bench_times = []
    for si, (B, T, H, D) in enumerate(shapes):
        name = f"{B}x{T}x{H}x{D}"
        for var in variants:
            try:
                fwd, both, strm, errs, mem, tflops, fwd_db = bench_layer(var, B, T, H, D, a.reps, a.gmean, 11 + si)
            except Exception as e:  # noqa: BLE001 (one failing kernel leaves the others' rows)
                print(f"{name:16s} {var:9s} | failed: {type(e).__name__}: {str(e)[:160]}", flush=True)
                torch.cuda.empty_cache()
                continue
            bench_times.append((name, var, fwd_db, strm))
            print(f"{name:16s} {var:9s} | {fwd:9.3f} {tflops:8.1f} | {both:9.3f} {strm:9.3f} | {errs[0]:9.2e} "
                  f"{errs[1]:9.2e} {errs[2]:9.2e} {errs[3]:9.2e} | {mem:7.2f}", flush=True)
            torch.cuda.empty_cache()
    if bench_times:
        print("\ntriton.testing.do_bench medians (as bench/fla_bench.py times):")
        print(f"{'B x T x H x D':16s} {'variant':9s} | {'fwd ms':>9s} | {'f+b ms':>9s}")
        for name, var, f, b in bench_times:
            print(f"{name:16s} {var:9s} | {f:9.3f} | {b:9.3f}")
    if decode:
        print("\ndecode step (H=16, D=128, state after a 512-token prefill; rel err of o of the first step, b = 0, "
              f"h < 2; do_bench median):\n{'B':>6s} {'variant':9s} | {'ms/token':>10s} {'tokens/s':>12s} | "
              f"{'rel err':>9s}")
    for B in decode:
        for var in variants:
            try:
                ms, err = bench_decode(var, B, a.gmean)
            except Exception as e:  # noqa: BLE001
                print(f"{B:6d} {var:9s} | failed: {type(e).__name__}: {str(e)[:160]}", flush=True)
                continue
            print(f"{B:6d} {var:9s} | {ms:10.4f} {B / ms * 1e3:12.0f} | {err:9.2e}", flush=True)


if __name__ == "__main__":
    main()
