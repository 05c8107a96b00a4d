"""Times NX-AI's xLSTM kernels (the peers) at the shapes of `mesanet bench xlstm --backend cuda`, and
prints the same tables.

Measurement tooling for the comparison only; nothing of NX-AI's code is part of mesanet, and its
sources are never committed. Bring them (git-ignored) into .peers/ beside bench/, as the package
folders of their repositories:

    .peers/mlstm_kernels/   github NX-AI/mlstm_kernels, its mlstm_kernels/ folder
    .peers/xlstm/           github NX-AI/xlstm, its xlstm/ folder (the CUDA sources under it included)
    .peers/flashrnn/        github NX-AI/flashrnn, its flashrnn/ folder

(bench/xlstm_peers_copy.sh SRC makes .peers/ from clones). Nothing is installed: the script
imports them from .peers/ (the GPU machine has no network), and a peer that does not import is
reported with what is missing and skipped. torch, triton and einops come from the machine.

Peers:
    mLSTM  mlstm_kernels' chunkwise--triton_xl_chunk (TFLA, chunk 128) and chunkwise--triton_limit_chunk
           (chunk 64), through mlstm_kernels.torch.get_mlstm_kernel: q, k, v [B, H, T, D] bf16, gates
           i, f [B, H, T] float32, autocast_kernel_dtype bf16, eps 1e-6.
    sLSTM  xlstm.blocks.slstm.cell.sLSTMCell with backend "cuda" (NX-AI's CUDA kernel, compiled at the
           first call by torch's extension loader: a minute or more, once per (batch, hidden, heads));
           FlashRNN's flashrnn(..., function="slstm") with backends cuda_fused and cuda (--slstm-kernels).

Conventions, converted to mesanet's (core/backend.h's MlstmOps and SlstmOps):
  * mLSTM: mlstm_kernels takes the forget gate's PRE-activation f~ and applies logsigmoid inside;
    mesanet takes f = logsigmoid(f~). Both scale q.k by Dk^-1/2 on q, start from m0 = 0 (no initial
    state), and divide by max(|s n.q|, exp(-m)) + eps with eps 1e-6 (mlstm_kernels' wrappers'
    default; the autograd Function's own default is 0). The gradient errors are of h, dq, dk, dv,
    dfg (d/d f = the peer's d/d f~ divided by sigmoid(-f~), exactly) and dig.
  * sLSTM: sLSTMCell's input is [B, T, 4 D] in gate-major order i, f, z, o (mesanet's x [B,T,4,D]);
    its internal recurrent kernel of the cuda backend [H, Dh, 4 Dh] is mesanet's R [H, Dh, 4, Dh];
    its bias (added inside) is set to zero since mesanet's x carries the biases; output [B, H, T, Dh].
    FlashRNN: Wx [B, T, 4, H, Dh], R [4, H, Dh_out, Dh_in] (mesanet's R permuted), zero bias; its
    normaliser n_t = max(f' n + i', 1) is mesanet's n_t (>= 1 in exact arithmetic when stabilised).
  * Both cast to bf16 inside (x, R, h, the states); R is drawn bf16-representable so that the
    reference sees the same values.

Inputs as `mesanet bench xlstm` draws them (another generator, the same distributions): unit-norm q,
k rows, v and dh ~ N(0, 1) (bf16), f~ ~ N(gmean, 1), i ~ N(0, 1) (float32); sLSTM x ~ N(0, 1) with
the f gate's N(gmean, 1), R ~ N(0, 1/Dh).

Errors, as mesanet's: the relative L2 error against a float64 torch reference implemented here (the
mLSTM's stabilised parallel form with m0 = 0 and m held constant in the backward, as
src/ref/mlstm_ref.c; the sLSTM's step recurrence of src/ref/slstm_ref.c), on the slice b = 0, the
first --err-heads heads, the first --err-T tokens, from one more fwd + bwd with dh zero outside the
slice (past its tokens; for the sLSTM also in the other sequences). --self-check compares the
references with their other forms (and the sLSTM's with the xlstm package's vanilla cell where it
imports) on the CPU, and exits.

Timing, as `mesanet bench xlstm`: "fwd ms" and "f+b ms" the median of --reps single calls timed on the
host after a synchronisation; "f+b strm" triton.testing.do_bench's median; a second table gives
do_bench's fwd and f+b. Memory: the device memory in use (total less free) after the f+b.

Options: --mlstm BxTxHxDk[xDv],... (default 8x2048x16x128,16x2048x8x64), --slstm BxTxHxDh,... (default
16x1024x4x192), --mlstm-kernels triton_xl_chunk,triton_limit_chunk, --slstm-kernels xlstm-cuda,flashrnn-cuda_fused,flashrnn-cuda, --reps N (10),
--gmean G (3), --err-heads N (2), --err-T N (2048; 0: all tokens), --self-check.
"""
import argparse
import contextlib
import functools
import importlib
import os
import sys
import time
import traceback

PEERS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".peers")
sys.path.insert(0, os.path.abspath(PEERS))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

MLSTM_KERNELS = {"triton_xl_chunk": 128, "triton_limit_chunk": 64}  # name: chunk size
SLSTM_KERNELS = ["xlstm-cuda", "flashrnn-cuda_fused", "flashrnn-cuda"]  # the sLSTMCell's; FlashRNN's backends
EPS = 1e-6


def peer(module, what):
    """Imports a peer's module from .peers/, or says what is missing and returns None."""
    try:
        return importlib.import_module(module)
    except Exception as e:  # noqa: BLE001 (ImportError, or an error inside the peer's own imports)
        print(f"{what}: cannot import {module} from {os.path.abspath(PEERS)}: {type(e).__name__}: {e}\n"
              f"  (copy the peer's package folder into .peers/: see the top of bench/xlstm_kernels_bench.py)",
              flush=True)
        return None


@contextlib.contextmanager
def stdout_to_stderr():
    """Sends file descriptor 1 to 2 for a while: the peers' extension builds print there (their
    compiler commands and output belong in the log, not in the tables)."""
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


def parse_shapes(s, allow_dv):
    out = []
    for part in [p for p in s.split(",") if p]:
        v = [int(x) for x in part.split("x")]
        if len(v) not in ((4, 5) if allow_dv else (4,)) or min(v) < 1:
            sys.exit(f"bad shape '{part}': expected BxTxHxD{'[xDv]' if allow_dv else ''}, positive sizes")
        out.append(tuple(v) if len(v) == 5 else (*v, v[3]))
    return out


# --- float64 references (mesanet's src/ref) ---------------------------------------------------------

def mlstm_ref(q, k, v, fg, ig, scale, eps=EPS):
    """The stabilised parallel form from m0 = 0 (src/ref/mlstm_ref.c), m held constant for the
    backward: q, k [T, Hn, Dk], v [T, Hn, Dv], log forget gates fg and input gates ig [T, Hn]
    (float64); h [T, Hn, Dv]."""
    T = q.shape[0]
    cs = torch.cumsum(fg, 0)
    logd = cs[:, None, :] - cs[None, :, :] + ig[None, :, :]  # [t, j, h]
    causal = torch.ones(T, T, dtype=torch.bool, device=q.device).tril()[:, :, None]
    logd = logd.masked_fill(~causal, float("-inf"))
    with torch.no_grad():
        m = torch.maximum(cs, logd.max(1).values)  # [t, h]: the m0 = 0 path and the pairs
    w = scale * torch.einsum("thd,jhd->tjh", q, k) * torch.exp(logd - m[:, None, :])
    den = torch.maximum(w.sum(1).abs(), torch.exp(-m)) + eps
    return torch.einsum("tjh,jhd->thd", w, v) / den[:, :, None]


def mlstm_ref_recurrent(q, k, v, fg, ig, scale, eps=EPS):
    """The recurrent form of the same (for --self-check): h [T, Hn, Dv]."""
    T, Hn, Dk = q.shape
    C = torch.zeros(Hn, v.shape[2], Dk, dtype=q.dtype)
    n = torch.zeros(Hn, Dk, dtype=q.dtype)
    m = torch.zeros(Hn, dtype=q.dtype)
    out = []
    for t in range(T):
        mt = torch.maximum(fg[t] + m, ig[t])
        a, b = torch.exp(fg[t] + m - mt), torch.exp(ig[t] - mt)
        C = a[:, None, None] * C + b[:, None, None] * v[t][:, :, None] * k[t][:, None, :]
        n = a[:, None] * n + b[:, None] * k[t]
        nq = scale * (n * q[t]).sum(-1)
        out.append(scale * torch.einsum("hvk,hk->hv", C, q[t]) / (torch.maximum(nq.abs(), torch.exp(-mt)) + eps)[:, None])
        m = mt
    return torch.stack(out)


def slstm_ref(x, R):
    """The sLSTM step recurrence (src/ref/slstm_ref.c) from a zero state: x [T, 4, Hn, Dh] (gates i, f,
    z, o; biases included), R [Hn, Dh, 4, Dh] (input cell a, gate g, output cell b); h [T, Hn, Dh]."""
    T, _, Hn, Dh = x.shape
    h = c = n = m = torch.zeros(Hn, Dh, dtype=x.dtype, device=x.device)
    out = []
    for t in range(T):
        r = x[t] + torch.einsum("ha,hagb->ghb", h, R)
        ri, rf, rz, ro = r.unbind(0)
        lf = F.logsigmoid(rf) + m
        mt = torch.where(n == 0, ri, torch.maximum(lf, ri))
        ip = torch.exp(ri - mt).clamp(max=1.0)
        fp = torch.exp(lf - mt).clamp(max=1.0)
        c = fp * c + ip * torch.tanh(rz)
        n = fp * n + ip
        h = torch.sigmoid(ro) * c / n
        m = mt
        out.append(h)
    return torch.stack(out)


def rel(a, e):
    a, e = a.double(), e.double()
    return ((a - e).norm() / e.norm()).item()


def self_check():
    """The references against their other forms, float64 on the CPU; True where they agree."""
    g = torch.Generator().manual_seed(0)
    T, Hn, Dk, Dv = 37, 2, 8, 6
    q, k = torch.randn(T, Hn, Dk, generator=g, dtype=torch.float64), torch.randn(T, Hn, Dk, generator=g, dtype=torch.float64)
    v = torch.randn(T, Hn, Dv, generator=g, dtype=torch.float64)
    fg = F.logsigmoid(torch.randn(T, Hn, generator=g, dtype=torch.float64) + 3)
    ig = torch.randn(T, Hn, generator=g, dtype=torch.float64) * 3
    e1 = rel(mlstm_ref(q, k, v, fg, ig, Dk ** -0.5), mlstm_ref_recurrent(q, k, v, fg, ig, Dk ** -0.5))
    ok = e1 < 1e-12
    print(f"self-check: mLSTM parallel vs recurrent reference: rel diff {e1:.2e}{'' if e1 < 1e-12 else '  FAILED'}")
    Dh = 5
    x = torch.randn(T, 4, Hn, Dh, generator=g, dtype=torch.float64)
    x[:, 1] += 3
    R = torch.randn(Hn, Dh, 4, Dh, generator=g, dtype=torch.float64) / Dh ** 0.5
    h = slstm_ref(x, R)
    vanilla = peer("xlstm.blocks.slstm.src.vanilla.slstm", "self-check: the xlstm package's vanilla sLSTM")
    if vanilla is not None:
        # its pointwise step on the same pre-activations: states [4, B, D], raw gate-major [B, 4 D]
        st = torch.zeros(4, 1, Hn * Dh, dtype=torch.float64)
        hs = []
        for t in range(T):
            y = st[0].view(Hn, Dh)
            ry = torch.einsum("ha,hagb->ghb", y, R).reshape(1, -1)
            st, _ = vanilla.slstm_forward_pointwise(x[t].reshape(1, -1), ry, torch.zeros(1, 4 * Hn * Dh, dtype=torch.float64),
                                                    st, {})
            hs.append(st[0].view(Hn, Dh))
        e2 = rel(h, torch.stack(hs))
        ok &= e2 < 1e-12
        print(f"self-check: sLSTM reference vs the xlstm package's vanilla step: rel diff {e2:.2e}"
              f"{'' if e2 < 1e-12 else '  FAILED'}")
    return ok


# --- timing --------------------------------------------------------------------------------------

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


def do_bench(fn):
    import triton
    return triton.testing.do_bench(fn, return_mode="median")


def timings(fwd, fwd_bwd, reps):
    """(fwd ms, f+b ms, f+b strm, memory GB, do_bench fwd ms)."""
    tf = host_median(fwd, reps)
    tb = host_median(fwd_bwd, reps)
    strm = do_bench(fwd_bwd)
    mem = mem_gb()
    return tf, tb, strm, mem, do_bench(fwd)


# --- mLSTM ---------------------------------------------------------------------------------------

def mlstm_inputs(B, T, H, Dk, Dv, seed, gmean):
    """mesanet's layout [B, T, H, D] (q, k, v, dh bf16) and [B, T, H] gates (float32): f~ the forget
    gate's pre-activation."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    q = F.normalize(torch.randn(B, T, H, Dk, device="cuda", generator=g, dtype=torch.float64), dim=-1).bfloat16()
    k = F.normalize(torch.randn(B, T, H, Dk, device="cuda", generator=g, dtype=torch.float64), dim=-1).bfloat16()
    v = torch.randn(B, T, H, Dv, device="cuda", generator=g).bfloat16()
    dh = torch.randn(B, T, H, Dv, device="cuda", generator=g).bfloat16()
    fpre = (torch.randn(B, T, H, device="cuda", generator=g) + gmean).float()
    ig = torch.randn(B, T, H, device="cuda", generator=g).float()
    return q, k, v, fpre, ig, dh


def mlstm_exact(q, k, v, fpre, ig, dh, Hn, Tn):
    """float64 h, dq, dk, dv, dfg, dig on b = 0, h < Hn, t < Tn ([Tn, Hn, ...], mesanet's layout)."""
    sl = [x[0, :Tn, :Hn].double() for x in (q, k, v)]
    fg = F.logsigmoid(fpre[0, :Tn, :Hn].double())
    leaves = [x.clone().requires_grad_(True) for x in (*sl, fg, ig[0, :Tn, :Hn].double())]
    h = mlstm_ref(*leaves, q.shape[-1] ** -0.5)
    h.backward(dh[0, :Tn, :Hn].double())
    return [h.detach()] + [x.grad for x in leaves]


def bench_mlstm_kernel(kern, chunk, shape, reps, gmean, seed, Hn, Tn):
    B, T, H, Dk, Dv = shape
    q, k, v, fpre, ig, dh = mlstm_inputs(B, T, H, Dk, Dv, seed, gmean)
    # the peer's layout [B, H, T, D], contiguous, made once (not timed)
    tq, tk, tv, tdh = (x.transpose(1, 2).contiguous() for x in (q, k, v, dh))
    tf_, ti = (x.transpose(1, 2).contiguous() for x in (fpre, ig))
    call = functools.partial(kern, return_last_states=False, eps=EPS, chunk_size=chunk,
                             autocast_kernel_dtype=torch.bfloat16)
    leaves = [x.clone().requires_grad_(True) for x in (tq, tk, tv, ti, tf_)]
    grad = [tdh]

    def fwd():
        with torch.no_grad():
            return call(tq, tk, tv, ti, tf_)

    def fwd_bwd():
        for x in leaves:
            x.grad = None
        call(*leaves).backward(grad[0])

    tf, tb, strm, mem, db_fwd = timings(fwd, fwd_bwd, reps)
    # errors: one more fwd + bwd with dh zero past the slice's tokens
    grad[0] = tdh.clone()
    grad[0][:, :, Tn:] = 0
    for x in leaves:
        x.grad = None
    h = call(*leaves)
    h.backward(grad[0])
    exact = mlstm_exact(q, k, v, fpre, ig, dh, Hn, Tn)
    lq, lk, lv, li, lf = leaves

    def mine(t):  # [B, H, T, ...] -> the slice in mesanet's layout [Tn, Hn, ...]
        return t[0, :Hn, :Tn].transpose(0, 1).double()

    dfg = mine(lf.grad) / torch.sigmoid(-mine(tf_))  # d/d f = d/d f~ / (d f / d f~)
    errs = [rel(mine(h.detach()), exact[0]), rel(mine(lq.grad), exact[1]), rel(mine(lk.grad), exact[2]),
            rel(mine(lv.grad), exact[3]), rel(dfg, exact[4]), rel(mine(li.grad), exact[5])]
    tflops = B * T * H * (4.0 * Dk * Dv + 64.0 * (Dk + Dv)) / (tf * 1e-3) / 1e12
    return tf, tb, strm, mem, db_fwd, errs, tflops


# --- sLSTM ---------------------------------------------------------------------------------------

def slstm_inputs(B, T, H, Dh, seed, gmean):
    """x [B, T, 4, D] bf16 (D = H Dh), R [H, Dh, 4, Dh] float32 holding bf16 values, dh [B, T, D] bf16."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    D = H * Dh
    x = torch.randn(B, T, 4, D, device="cuda", generator=g)
    x[:, :, 1] += gmean
    R = (torch.randn(H, Dh, 4, Dh, device="cuda", generator=g) / Dh ** 0.5).bfloat16().float()
    dh = torch.randn(B, T, D, device="cuda", generator=g).bfloat16()
    return x.bfloat16(), R, dh


def slstm_exact(x, R, dh, Hn, Tn):
    """float64 h [Tn, Hn, Dh], dx [Tn, 4, Hn, Dh], dR [Hn, Dh, 4, Dh] of b = 0 alone."""
    H, Dh = R.shape[0], R.shape[1]
    xs = x[0, :Tn].double().view(Tn, 4, H, Dh)[:, :, :Hn].clone().requires_grad_(True)
    Rs = R[:Hn].double().clone().requires_grad_(True)
    h = slstm_ref(xs, Rs)
    h.backward(dh[0, :Tn].double().view(Tn, H, Dh)[:, :Hn])
    return h.detach(), xs.grad, Rs.grad


def slstm_errors(h, dx, dR, x, R, dh, Hn, Tn):
    """h [B, T, H, Dh], dx [B, T, 4, H, Dh], dR [H, Dh, 4, Dh] (mesanet's layouts) against the reference."""
    eh, edx, edr = slstm_exact(x, R, dh, Hn, Tn)
    return [rel(h[0, :Tn, :Hn], eh), rel(dx[0, :Tn, :, :Hn], edx), rel(dR[:Hn], edr)]


def bench_slstm_xlstm(cellmod, shape, reps, gmean, seed, Hn, Tn):
    B, T, H, Dh = shape[:4]
    D = H * Dh
    x, R, dh = slstm_inputs(B, T, H, Dh, seed, gmean)
    cfg = cellmod.sLSTMCellConfig(hidden_size=D, num_heads=H, backend="cuda", batch_size=B,
                                  bias_init="standard", recurrent_weight_init="zeros")
    with stdout_to_stderr():  # the CUDA extension is built here (once per batch, hidden size and heads)
        cell = cellmod.sLSTMCell(cfg).cuda()
    with torch.no_grad():
        cell._recurrent_kernel_.copy_(R.reshape(H, Dh, 4 * Dh))  # the cuda backend's layout is mesanet's
        cell._bias_.zero_()
    xin = x.reshape(B, T, 4 * D).clone().requires_grad_(True)
    grad = [dh.view(B, T, H, Dh).transpose(1, 2).contiguous()]  # the output's [B, H, T, Dh]

    def fwd():
        with torch.no_grad():
            return cell(xin)[0]

    def fwd_bwd():
        xin.grad = None
        cell._recurrent_kernel_.grad = None
        cell(xin)[0].backward(grad[0])

    tf, tb, strm, mem, db_fwd = timings(fwd, fwd_bwd, reps)
    dz = torch.zeros_like(dh)
    dz[0, :Tn] = dh[0, :Tn]
    grad[0] = dz.view(B, T, H, Dh).transpose(1, 2).contiguous()
    xin.grad = None
    cell._recurrent_kernel_.grad = None
    out = cell(xin)[0]
    out.backward(grad[0])
    errs = slstm_errors(out.detach().transpose(1, 2), xin.grad.view(B, T, 4, H, Dh),
                        cell._recurrent_kernel_.grad.view(H, Dh, 4, Dh), x, R, dh, Hn, Tn)
    return tf, tb, strm, mem, db_fwd, errs


def bench_slstm_flashrnn(frmod, backend, shape, reps, gmean, seed, Hn, Tn):
    B, T, H, Dh = shape[:4]
    x, R, dh = slstm_inputs(B, T, H, Dh, seed, gmean)
    wx = x.view(B, T, 4, H, Dh).clone().requires_grad_(True)
    rf = R.bfloat16().permute(2, 0, 3, 1).contiguous().requires_grad_(True)  # [4, H, Dh_out, Dh_in]
    b = torch.zeros(4, H, Dh, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    grad = [dh.view(B, T, H, Dh)]

    def call():
        return frmod.flashrnn(wx, rf, b, function="slstm", backend=backend, dtype="bfloat16")[0][0]  # h [B,T,H,Dh]

    def fwd():
        with torch.no_grad():
            return call()

    def fwd_bwd():
        wx.grad = rf.grad = b.grad = None
        call().backward(grad[0])

    with stdout_to_stderr():  # the first call builds (and for cuda_fused tunes) the CUDA extension
        fwd_bwd()
        torch.cuda.synchronize()
    tf, tb, strm, mem, db_fwd = timings(fwd, fwd_bwd, reps)
    dz = torch.zeros_like(dh)
    dz[0, :Tn] = dh[0, :Tn]
    grad[0] = dz.view(B, T, H, Dh)
    wx.grad = rf.grad = b.grad = None
    out = call()
    out.backward(grad[0])
    errs = slstm_errors(out.detach(), wx.grad, rf.grad.permute(1, 3, 0, 2), x, R, dh, Hn, Tn)
    return tf, tb, strm, mem, db_fwd, errs


# --- main ----------------------------------------------------------------------------------------

def row_failed(name, kernel, e):
    print(f"{name:20s} {kernel:22s} | failed: {type(e).__name__}: {str(e).strip().splitlines()[-1][:200] if str(e) else ''}",
          flush=True)
    if os.environ.get("XLSTM_BENCH_TRACE"):
        traceback.print_exc()
    torch.cuda.empty_cache()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mlstm", default="8x2048x16x128,16x2048x8x64")
    ap.add_argument("--slstm", default="16x1024x4x192")
    ap.add_argument("--mlstm-kernels", default=",".join(MLSTM_KERNELS))
    ap.add_argument("--slstm-kernels", default=",".join(SLSTM_KERNELS))
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--gmean", type=float, default=3.0)
    ap.add_argument("--err-heads", type=int, default=2)
    ap.add_argument("--err-T", type=int, default=2048)
    ap.add_argument("--self-check", action="store_true", help="check the float64 references on the CPU and exit")
    a = ap.parse_args()
    if a.self_check:
        sys.exit(0 if self_check() else 1)
    mshapes, sshapes = parse_shapes(a.mlstm, True), parse_shapes(a.slstm, False)
    kernels = [x for x in a.mlstm_kernels.split(",") if x]
    for x in kernels:
        if x not in MLSTM_KERNELS:
            sys.exit(f"--mlstm-kernels: unknown '{x}' ({', '.join(MLSTM_KERNELS)})")
    skernels = [x for x in a.slstm_kernels.split(",") if x]
    for x in skernels:
        if x not in SLSTM_KERNELS:
            sys.exit(f"--slstm-kernels: unknown '{x}' ({', '.join(SLSTM_KERNELS)})")
    if a.reps < 1 or a.err_heads < 1 or a.err_T < 0:
        sys.exit("--reps >= 1, --err-heads >= 1, --err-T >= 0")
    if not torch.cuda.is_available():
        sys.exit("xlstm_kernels_bench.py: no CUDA device (the peers' kernels need one; --self-check runs on the CPU)")
    import triton
    self_check()
    print(f"NX-AI's xLSTM kernels on {torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}")
    mat = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    ms = do_bench(functools.partial(torch.matmul, mat, mat))
    del mat
    torch.cuda.empty_cache()
    print(f"bf16 matrix product 8192^3 in the same run: {2 * 8192 ** 3 / ms / 1e9:.0f} TFLOP/s")
    print(f"fwd ms, f+b ms: median of {a.reps} single calls, host-timed; f+b strm: triton.testing.do_bench; "
          f"tok/s = B T / time; mem: device memory in use after the f+b")
    print("(the first call of a kernel at a shape compiles it: Triton's JIT, torch.compile'd helpers, the sLSTM "
          "CUDA extension)", file=sys.stderr, flush=True)
    bench = []

    if mshapes:
        print(f"\nmLSTM kernels (mlstm_kernels): bf16 q k v h, float32 gates; scale Dk^-1/2, eps {EPS:g}, m0 = 0")
        print(f"rel err of h, dq, dk, dv, dfg, dig against a float64 reference on a slice: b = 0, the first "
              f"{a.err_heads} heads, {'all tokens' if a.err_T == 0 else f'the first min(T, {a.err_T}) tokens'} "
              "(dh zero outside it)")
        print(f"{'B x T x H x Dk x Dv':20s} {'kernel':22s} | {'fwd ms':>9s} {'fwd tok/s':>11s} {'TFLOP/s':>8s} | "
              f"{'f+b ms':>9s} {'f+b strm':>9s} {'f+b tok/s':>11s} | {'err h':>8s} {'err dq':>8s} {'err dk':>8s} "
              f"{'err dv':>8s} {'err dfg':>8s} {'err dig':>8s} | {'mem GB':>6s}", flush=True)
        mk = peer("mlstm_kernels.torch", "mlstm_kernels") if kernels else None
        for si, shape in enumerate(mshapes):
            B, T, H, Dk, Dv = shape
            name = f"{B}x{T}x{H}x{Dk}x{Dv}"
            for kname in kernels if mk else []:
                try:
                    kern = mk.get_mlstm_kernel(f"chunkwise--{kname}")
                    tf, tb, strm, mem, dbf, errs, tflops = bench_mlstm_kernel(
                        kern, MLSTM_KERNELS[kname], shape, a.reps, a.gmean, 101 + si, min(H, a.err_heads),
                        T if a.err_T == 0 else min(T, a.err_T))
                except Exception as e:  # noqa: BLE001 (one failing kernel leaves the others' rows)
                    row_failed(name, kname, e)
                    continue
                ntok = B * T
                print(f"{name:20s} {kname:22s} | {tf:9.3f} {ntok / tf * 1e3:11.0f} {tflops:8.1f} | {tb:9.3f} "
                      f"{strm:9.3f} {ntok / tb * 1e3:11.0f} | " + " ".join(f"{x:8.2e}" for x in errs) +
                      f" | {mem:6.2f}", flush=True)
                bench.append((name, kname, dbf, strm))
                torch.cuda.empty_cache()

    if sshapes:
        print("\nsLSTM kernels: bf16 x h dh dx and R (cast inside), zero bias; no gradient clipping")
        print(f"rel err of h, dx, dR against a float64 reference on a slice: b = 0, the first {a.err_heads} heads, "
              f"{'all tokens' if a.err_T == 0 else f'the first min(T, {a.err_T}) tokens'} (dh zero outside it)")
        print(f"{'B x T x H x Dh':20s} {'kernel':22s} | {'fwd ms':>9s} {'fwd tok/s':>11s} | {'f+b ms':>9s} "
              f"{'f+b strm':>9s} {'f+b tok/s':>11s} | {'err h':>8s} {'err dx':>8s} {'err dR':>8s} | {'mem GB':>6s}",
              flush=True)
        cellmod = peer("xlstm.blocks.slstm.cell", "xlstm (NX-AI's sLSTM CUDA kernel)") if "xlstm-cuda" in skernels else None
        if cellmod is not None and not hasattr(torch.cuda.amp, "custom_fwd"):  # the cell's decorators (torch < 3)
            torch.cuda.amp.custom_fwd = functools.partial(torch.amp.custom_fwd, device_type="cuda")
            torch.cuda.amp.custom_bwd = functools.partial(torch.amp.custom_bwd, device_type="cuda")
        frbackends = [x[len("flashrnn-"):] for x in skernels if x.startswith("flashrnn-")]
        frmod = peer("flashrnn", "FlashRNN") if frbackends else None
        runs = ([("xlstm-cuda", lambda sh, si, hn, tn: bench_slstm_xlstm(cellmod, sh, a.reps, a.gmean, 201 + si, hn, tn))]
                if cellmod else [])
        for fb in frbackends if frmod else []:
            runs.append((f"flashrnn-{fb}", functools.partial(
                lambda fb_, sh, si, hn, tn: bench_slstm_flashrnn(frmod, fb_, sh, a.reps, a.gmean, 201 + si, hn, tn), fb)))
        for si, shape in enumerate(sshapes):
            B, T, H, Dh = shape[:4]
            name = f"{B}x{T}x{H}x{Dh}"
            for kname, run in runs:
                try:
                    tf, tb, strm, mem, dbf, errs = run(shape, si, min(H, a.err_heads), T if a.err_T == 0 else min(T, a.err_T))
                except Exception as e:  # noqa: BLE001
                    row_failed(name, kname, e)
                    continue
                ntok = B * T
                print(f"{name:20s} {kname:22s} | {tf:9.3f} {ntok / tf * 1e3:11.0f} | {tb:9.3f} {strm:9.3f} "
                      f"{ntok / tb * 1e3:11.0f} | " + " ".join(f"{x:8.2e}" for x in errs) + f" | {mem:6.2f}", flush=True)
                bench.append((name, kname, dbf, strm))
                torch.cuda.empty_cache()

    if bench:
        print("\ntriton.testing.do_bench medians:")
        print(f"{'shape':20s} {'kernel':22s} | {'fwd ms':>9s} | {'f+b ms':>9s}")
        for name, kname, f, b in bench:
            print(f"{name:20s} {kname:22s} | {f:9.3f} | {b:9.3f}")
    sys.exit(0 if bench else 1)


if __name__ == "__main__":
    main()
