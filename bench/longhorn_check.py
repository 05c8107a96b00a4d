"""Longhorn checkpoints against the official code, both ways: Cranial-XIX/Longhorn's
models/longhorn.py (LonghornLMHeadModel) with the PyTorch reference scan of its CUDA package
(Cranial-XIX/longhorn_cuda, mamba_ssm/ops/selective_scan_interface.py: selective_scan_online7_ref),
against mesanet's `longhorn` blocks (model/format_longhorn.h reads and writes the folder).

NOT part of the C test suite (tests/test_longhorn.c checks the format on the CPU without Python). It
needs torch and safetensors, and the two official source files in the git-ignored .peers/ (never
committed):

    .peers/longhorn/models/longhorn.py
    .peers/longhorn_cuda/mamba_ssm/ops/selective_scan_interface.py

and runs on the GPU machine (or any machine with torch):

    python3 bench/longhorn_check.py [WORK_DIR] --mesanet build/mesanet --peers .peers

Nothing of the official packages is compiled: the modules their files import (mamba_ssm's CUDA scan,
causal_conv1d, Triton's fused norms, fast_layer_norm, the generation mixin) are replaced by stand-ins
before the files are loaded, and the layer's fused function longhorn_inner_fn by the composition
their own longhorn_ref makes (causal depthwise convolution with bias and SiLU, x_proj split into
delta's rank, k and q, dt_head's weight), with the scan done by their selective_scan_online7_ref (a
loop over time in float32) instead of the CUDA kernel. The block runs with fused_add_norm off (the
same function, unfused); RMSNorm is the plain formula. einops is used where installed; otherwise a
small rearrange of its pattern language stands in (the files use rearrange alone on these paths).

Every tensor of every model is random (the official init zeroes the biases, and D = 1, which would
hide layout errors). The Python model runs in float32 with TF32 off; mesanet runs its float32 CPU
backend (`mesanet logits --backend cpu`).

(a) official -> mesanet: LonghornLMHeadModel of d_model 48, 3 blocks, d_state 16, vocabulary 101
    (padded to 104 by the module), tied and untied; its state dict saved with safetensors (each
    tensor cloned: the tied head shares the embedding) beside config.json (the config's fields, as
    its save_pretrained writes them); `mesanet logits` of that folder against the module's logits at
    37 and 300 tokens. The same tensors under LonghornLM's "transformer." names (nanoGPT's train.py)
    load too.
(b) mesanet -> official: `mesanet export` of (a)'s folder as ours, every tensor then replaced by
    another random one under our names, `mesanet export --format longhorn` of that; LonghornConfig(**
    config.json) builds the module, load_state_dict(strict=True) takes the file; its logits against
    `mesanet logits` of our folder.

Tolerance: the relative (Frobenius) error of the logits at most 1e-4, the argmax agreeing at 99% of
positions. Both sides compute the same function in float32 (the scan's sums of 16 terms per output,
the projections' of at most a few hundred), so rounding leaves errors around 1e-6; a layout error (a
swapped x / z half, k and q exchanged, the bias in the wrong place) moves the logits by O(1). Exits 1
if any comparison fails.
"""
import argparse
import importlib.util
import json
import math
import os
import shutil
import sys
import types

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from peers import compare, mesanet_logits  # noqa: E402

TOL, AGREE = 1e-4, 0.99


# ------------------------------------------------------------------ stand-ins for what is compiled

def einops_rearrange(t, pattern, **sizes):
    """einops.rearrange for patterns of names, parenthesised groups and 1 (what the official files use)."""
    def groups(side):
        out, cur, depth = [], None, 0
        for tok in side.replace("(", " ( ").replace(")", " ) ").split():
            if tok == "(":
                cur, depth = [], 1
            elif tok == ")":
                out.append(cur)
                cur, depth = None, 0
            elif depth:
                cur.append(tok)
            else:
                out.append([] if tok == "1" else [tok])
        return out
    left, right = (groups(s) for s in pattern.split("->"))
    assert len(left) == t.dim(), (pattern, tuple(t.shape))
    known = dict(sizes)
    for g, n in zip(left, t.shape):
        missing = [a for a in g if a not in known]
        prod = math.prod(known[a] for a in g if a in known)
        if missing:
            assert len(missing) == 1, pattern
            known[missing[0]] = n // prod
    flat = [a for g in left for a in g]
    t = t.reshape([known[a] for a in flat])
    order = [a for g in right for a in g]
    t = t.permute([flat.index(a) for a in order])
    return t.reshape([math.prod(known[a] for a in g) for g in right])


def unavailable(name):
    def f(*args, **kwargs):
        raise NotImplementedError(f"{name} is compiled code, not loaded by bench/longhorn_check.py")
    return f


class RMSNorm(nn.Module):
    """mamba_ssm's RMSNorm, unfused: x / sqrt(mean(x^2) + eps) * weight."""

    def __init__(self, hidden_size, eps=1e-5, device=None, dtype=None):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(hidden_size, device=device, dtype=dtype))
        self.register_parameter("bias", None)

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def module(name, **attrs):
    m = types.ModuleType(name)
    m.__dict__.update(attrs)
    sys.modules[name] = m
    return m


def load_file(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    m = importlib.util.module_from_spec(spec)
    sys.modules[name] = m
    spec.loader.exec_module(m)
    return m


def load_official(peers):
    """The official LonghornLMHeadModel with their reference scan in place of the CUDA kernel."""
    import torch.cuda.amp as amp
    for name in ("custom_fwd", "custom_bwd"):  # decorators of the autograd functions, unused here
        if not hasattr(amp, name):
            setattr(amp, name, lambda f=None, **kw: f if f is not None else (lambda g: g))
    try:
        import einops  # noqa: F401
    except ImportError:
        module("einops", rearrange=einops_rearrange, repeat=unavailable("einops.repeat"),
               einsum=unavailable("einops.einsum"), reduce=unavailable("einops.reduce"))
    module("fast_layer_norm")
    module("selective_scan_cuda")
    module("causal_conv1d", causal_conv1d_fn=None, causal_conv1d_update=None)
    module("mamba_ssm")
    module("mamba_ssm.ops")
    module("mamba_ssm.ops.triton")
    module("mamba_ssm.ops.triton.layernorm", RMSNorm=RMSNorm, layer_norm_fn=None, rms_norm_fn=None,
           _layer_norm_fwd=unavailable("_layer_norm_fwd"), _layer_norm_bwd=unavailable("_layer_norm_bwd"))
    module("mamba_ssm.utils")
    module("mamba_ssm.utils.generation", GenerationMixin=object)
    module("mamba_ssm.utils.hf", load_config_hf=unavailable("load_config_hf"),
           load_state_dict_hf=unavailable("load_state_dict_hf"))
    iface = load_file("longhorn_official_interface",
                      os.path.join(peers, "longhorn_cuda", "mamba_ssm", "ops", "selective_scan_interface.py"))
    scan_ref = iface.selective_scan_online7_ref

    def longhorn_inner_fn(xz, conv1d_weight, conv1d_bias, x_proj_weight, delta_proj_weight, norm_weight,
                          out_proj_weight, D=None, delta_bias=None):
        """Their longhorn_ref (selective_scan_interface.py) with the convolution in PyTorch and the
        reference scan: xz [B, 2E, L]."""
        assert norm_weight is None
        L = xz.shape[-1]
        R = delta_proj_weight.shape[1]
        N = (x_proj_weight.shape[0] - R) // 2
        x, z = xz.chunk(2, dim=1)
        x = F.silu(F.conv1d(x, conv1d_weight, conv1d_bias, padding=conv1d_weight.shape[-1] - 1,
                            groups=x.shape[1])[..., :L])
        x_dbl = F.linear(x.transpose(1, 2).reshape(-1, x.shape[1]), x_proj_weight)  # [(B L), R + 2N]
        delta = (delta_proj_weight @ x_dbl[:, :R].t()).reshape(-1, x.shape[0], L).transpose(0, 1)  # [B, E, L]
        K = x_dbl[:, R:R + N].reshape(x.shape[0], L, N).transpose(1, 2).contiguous()
        Q = x_dbl[:, -N:].reshape(x.shape[0], L, N).transpose(1, 2).contiguous()
        y = scan_ref(x, Q, K, delta.contiguous(), D=D, t_bias=delta_bias, z=z)  # [B, E, L]
        return F.linear(y.transpose(1, 2), out_proj_weight)

    module("mamba_ssm.ops.selective_scan_interface", longhorn_inner_fn=longhorn_inner_fn)
    return load_file("longhorn_official", os.path.join(peers, "longhorn", "models", "longhorn.py"))


# ------------------------------------------------------------------ models and folders

def randomize(model, seed):
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                v = 0.5 + torch.rand(p.shape, generator=gen)
            elif p.dim() > 1 and "embedding" not in name:
                v = torch.randn(p.shape, generator=gen) / np.sqrt(p.shape[-1])
            else:
                v = torch.randn(p.shape, generator=gen)
            p.copy_(v)


def save_folder(model, config, path, prefix=""):
    from safetensors.torch import save_file
    os.makedirs(path, exist_ok=True)
    sd = {prefix + k: v.detach().cpu().contiguous().clone() for k, v in model.state_dict().items()}
    save_file(sd, os.path.join(path, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(config.__dict__, f)


def randomize_file(path, seed):
    """Replaces every tensor of a safetensors file (our names) by random values."""
    from safetensors.torch import load_file, save_file
    gen = torch.Generator().manual_seed(seed)
    sd = load_file(path)
    out = {}
    for k, v in sd.items():
        if "norm" in k:
            out[k] = 0.5 + torch.rand(v.shape, generator=gen)
        elif v.dim() > 1 and "embeddings" not in k:
            out[k] = torch.randn(v.shape, generator=gen) / np.sqrt(v.shape[-1])
        else:
            out[k] = torch.randn(v.shape, generator=gen)
    save_file(out, path, metadata={"format": "pt"})


def logits(model, tokens, device):
    with torch.no_grad():
        ids = torch.tensor([tokens], device=device)
        return model(ids).logits[0].float().cpu().numpy()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("work", nargs="?", default="/tmp/longhorn_check")
    ap.add_argument("--mesanet", default="build/mesanet")
    ap.add_argument("--peers", default=".peers")
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    device = "cuda" if torch.cuda.is_available() else "cpu"
    lh = load_official(args.peers)
    shutil.rmtree(args.work, ignore_errors=True)
    os.makedirs(args.work)
    ok = True
    rng = np.random.default_rng(0)
    for tie in (True, False):
        cfg = lh.LonghornConfig(d_model=48, n_layer=3, vocab_size=101, ssm_cfg={"d_state": 16}, rms_norm=True,
                                residual_in_fp32=True, fused_add_norm=False, pad_vocab_size_multiple=8,
                                tie_embeddings=tie)
        torch.manual_seed(1)
        model = lh.LonghornLMHeadModel(cfg, device=device, dtype=torch.float32).eval()
        randomize(model, 2 + tie)
        V = model.lm_head.weight.shape[0]
        tag = "tied" if tie else "untied"
        print(f"LonghornLMHeadModel, {tag}: d_model 48, 3 blocks, vocabulary {V}", flush=True)
        # (a) the official folder read by mesanet
        theirs = os.path.join(args.work, f"official-{tag}")
        save_folder(model, cfg, theirs)
        for T in (37, 300):
            tokens = rng.integers(0, V, T).tolist()
            want = logits(model, tokens, device)
            got = mesanet_logits(args.mesanet, "cpu", theirs, tokens, os.path.join(args.work, "l.bin"))
            ok &= compare(f"official -> mesanet ({tag})", want, got, TOL, AGREE)
        lm = os.path.join(args.work, f"official-lm-{tag}")
        save_folder(model, cfg, lm, prefix="transformer.")
        got = mesanet_logits(args.mesanet, "cpu", lm, tokens, os.path.join(args.work, "l.bin"))
        ok &= compare(f"LonghornLM's transformer. names -> mesanet ({tag})", want, got, TOL, AGREE)
        # (b) ours, with other weights, exported as the official folder and loaded by the module
        ours = os.path.join(args.work, f"ours-{tag}")
        out = os.path.join(args.work, f"exported-{tag}")
        for cmd in ([args.mesanet, "export", theirs, ours], None, [args.mesanet, "export", ours, out, "--format", "longhorn"]):
            if cmd is None:
                randomize_file(os.path.join(ours, "model.safetensors"), 7 + tie)
                continue
            if os.system(" ".join(cmd)) != 0:
                print(f"  {' '.join(cmd)} failed  FAILED", flush=True)
                return 1
        with open(os.path.join(out, "config.json")) as f:
            c2 = json.load(f)
        c2["fused_add_norm"] = False  # the same function, unfused (the fused norms are Triton's)
        cfg2 = lh.LonghornConfig(**{k: v for k, v in c2.items() if k != "d_state"})
        cfg2.d_state = c2["d_state"]
        model2 = lh.LonghornLMHeadModel(cfg2, device=device, dtype=torch.float32).eval()
        from safetensors.torch import load_file
        missing, unexpected = model2.load_state_dict(load_file(os.path.join(out, "model.safetensors")), strict=True)
        print(f"  load_state_dict(strict=True): missing {list(missing)}, unexpected {list(unexpected)}", flush=True)
        for T in (37, 300):
            tokens = rng.integers(0, V, T).tolist()
            want = mesanet_logits(args.mesanet, "cpu", ours, tokens, os.path.join(args.work, "l.bin"))
            got = logits(model2, tokens, device)
            ok &= compare(f"mesanet -> official ({tag})", got, want, TOL, AGREE)
    print("all comparisons passed" if ok else "SOME COMPARISONS FAILED", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
