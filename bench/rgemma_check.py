"""RecurrentGemma checkpoints against transformers' RecurrentGemmaForCausalLM, both ways (mesanet's
`recurrent_gemma` architecture: hawk blocks for its "recurrent" ones, swa for its local "attention").

NOT part of the C test suite (tests/test_rgemma.c checks the format without Python). It needs torch,
transformers and safetensors, and runs on the GPU machine from the repository root:

    python3 bench/rgemma_check.py [WORK_DIR] [--mesanet build/mesanet] [--backend cpu|cuda]

Every tensor of every model is random (the default initialisation zeroes the norms' offsets, the
biases and the gates' biases, and would hide layout errors): norm weights (stored as the offset w of
the gain 1 + w) uniform in [-0.5, 0.5], matrices N(0, 1/fan-in), the rest N(0, 1). transformers runs
in float32 with TF32 off, on the GPU where there is one; mesanet runs its float32 CPU backend.

Two forwards of transformers' model are compared with mesanet's one forward (`mesanet logits`):
  - one forward over a sequence no longer than attention_window_size (use_cache=False);
  - one forward over three windows and more, with transformers' mask made local (the last
    attention_window_size tokens, the current one included, as the Griffin paper's local attention and
    mesanet's swa): transformers' own mask is causal only, so its forward past the window is not local
    attention, and its decoding past the window is not either (its _update_cache rolls the cache one
    step early, at position window - 1, so the oldest key is dropped while an empty, zero slot stays
    visible for window - 1 steps);
transformers' decoding (a prefill, then a token a step) is printed against its own forward for
information only: with transformers 5.17 the two disagree (5e-2) even within the window, and its
decoding fails where lru_width differs from hidden_size. mesanet's decoding equals its forward in its
own tests (the conformance battery's prefill + decode checks).

(a) transformers -> mesanet: transformers builds a random model and saves it (save_pretrained);
    `mesanet logits` of that folder is compared with transformers' logits.
(b) mesanet -> transformers: `mesanet export` writes our folder of the model (our config.json
    writer), whose weights are then replaced by other random ones under our names; transformers'
    from_pretrained loads it (missing / unexpected / mismatched tensors printed: all must be empty)
    and its logits are compared with `mesanet logits` of our folder. Then `mesanet train --steps 1`
    from transformers' config.json makes a checkpoint as training saves it, which transformers loads
    and compares the same way.

The tiny configs vary what can go wrong: grouped (multi-query) and full key/value heads, an LRU
wider than the model, an MLP width (intermediate_size / 2) unlike the others, a tied and an untied
head, another RoPE base, soft cap and norm epsilon, hidden sizes whose sqrt is not a bf16 number (the
embedding's bf16 `normalizer`), block patterns that cycle over the layers.

Tolerance: the relative (Frobenius) error of the logits at most 1e-4 (3e-2 with --backend cuda, whose
activations are bf16), the argmax agreeing at 99% of positions (90% on cuda). Both sides compute in
float32 with sums of at most a few hundred terms per output: rounding alone leaves around 1e-6 to 1e-5
(RoPE's angles, float32 in transformers and double in mesanet, differ by ~1e-7 t). A layout error (a
transposed gate block, the rotary half on the wrong features, a norm gain of w instead of 1 + w, an
unrounded embedding scale: 1e-3 relative) moves the logits by far more. Exits 1 if any check fails.
"""
import argparse
import inspect
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import torch

from peers import compare, mesanet_logits, write_shard

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
VOCAB = 256

# (name, config fields; rope_theta goes where the installed transformers takes it)
CASES = [
    ("hidden 48 (sqrt 6.928, bf16 6.9375), 2 heads of 24 (RoPE on 12), 1 kv head, LRU 64, MLP 40, "
     "4 layers r,r,a,r, window 16, conv 4, tied head",
     dict(hidden_size=48, num_attention_heads=2, num_key_value_heads=1, lru_width=64, intermediate_size=80,
          num_hidden_layers=4, block_types=["recurrent", "recurrent", "attention"], attention_window_size=16,
          conv1d_width=4, rope_theta=10000.0, tie_word_embeddings=True)),
    ("hidden 64, 4 heads of 16 (RoPE on 8), 4 kv heads, LRU 64, MLP 96, 3 layers r,a,r, window 8, conv 3, "
     "theta 500, untied head, soft cap 20, eps 1e-5",
     dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=4, lru_width=64, intermediate_size=192,
          num_hidden_layers=3, block_types=["recurrent", "attention"], attention_window_size=8, conv1d_width=3,
          rope_theta=500.0, tie_word_embeddings=False, logits_soft_cap=20.0, rms_norm_eps=1e-5)),
]


def make_config(fields):
    """transformers' RecurrentGemmaConfig of these fields: RoPE's base and partial factor as
    rope_parameters where its signature has them (transformers 5), else as rope_theta and
    partial_rotary_factor."""
    from transformers import RecurrentGemmaConfig
    f = dict(fields, vocab_size=VOCAB)
    theta = f.pop("rope_theta")
    if "rope_parameters" in inspect.signature(RecurrentGemmaConfig.__init__).parameters:
        f["rope_parameters"] = {"rope_type": "default", "rope_theta": theta, "partial_rotary_factor": 0.5}
    else:
        f.update(rope_theta=theta, partial_rotary_factor=0.5)
    return RecurrentGemmaConfig(**f)


def rand_like(name, shape, gen):
    if "norm" in name:
        return torch.rand(shape, generator=gen) - 0.5
    if len(shape) > 1 and "embed" not in name and "lm_head" not in name:
        return torch.randn(shape, generator=gen) / np.sqrt(shape[-1])
    return torch.randn(shape, generator=gen)


def randomize(model, seed):
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(rand_like(name, tuple(p.shape), gen))


def randomize_file(path, seed):
    """Replaces every tensor of a safetensors file (our names) by random values."""
    from safetensors.numpy import load_file, save_file
    gen = torch.Generator().manual_seed(seed)
    t = load_file(path)
    save_file({k: rand_like(k, v.shape, gen).numpy().astype(np.float32) for k, v in t.items()}, path,
              metadata={"format": "pt"})


def forward_logits(model, tokens, dev):
    with torch.no_grad():
        return model(torch.tensor([tokens], device=dev), use_cache=False).logits[0].float().cpu().numpy()


def step_logits(model, tokens, prefill, dev):
    """The logits at every position: a prefill of `prefill` tokens with the cache, then one token a call."""
    with torch.no_grad():
        x = torch.tensor([tokens], device=dev)
        rows = [model(x[:, :prefill], use_cache=True).logits[0]]
        for t in range(prefill, len(tokens)):
            out = model(x[:, t:t + 1], cache_position=torch.tensor([t], device=dev), use_cache=True)
            rows.append(out.logits[0])
        return torch.cat(rows).float().cpu().numpy()



def local_logits(model, tokens, window, dev):
    """One forward with a local mask: position i sees j in (i - window, i]. The mask each attention
    layer receives is replaced (how transformers builds it differs between its versions)."""
    n = len(tokens)
    i = torch.arange(n, device=dev)
    seen = (i[None, :] <= i[:, None]) & (i[None, :] > i[:, None] - window)
    saved = []
    for mod in model.modules():
        if type(mod).__name__.endswith("Attention") and hasattr(mod, "q_proj"):
            def local(*args, _f=mod.forward, **kw):
                h = args[0] if args else kw["hidden_states"]
                low = torch.finfo(h.dtype).min
                m = torch.zeros(n, n, dtype=h.dtype, device=h.device).masked_fill(~seen, low)
                m = m[None, None].expand(h.shape[0], 1, n, n)
                if len(args) > 2:
                    args = args[:2] + (m,) + args[3:]
                else:
                    kw["attention_mask"] = m
                return _f(*args, **kw)
            saved.append((mod, mod.forward))
            mod.forward = local
    if not saved:
        raise RuntimeError("no attention layer with q_proj found to give a local mask")
    try:
        return forward_logits(model, tokens, dev)
    finally:
        for mod, f in saved:
            mod.forward = f


def describe(model):
    n = model.model.normalizer
    c = model.config
    rope = getattr(c, "rope_parameters", None)
    return (f"normalizer {n.dtype} {n.float().item():.6f}; config: partial_rotary_factor "
            f"{getattr(c, 'partial_rotary_factor', None)}, rope {rope if rope else getattr(c, 'rope_theta', None)}, "
            f"head_dim {getattr(c, 'head_dim', None)}, layers {c.layers_block_type}, tie_word_embeddings "
            f"{getattr(c, 'tie_word_embeddings', None)}")


def compare_all(what, model, folder, a, work, seqs, dev, tag):
    """transformers' model (forward and steps) against `mesanet logits` of folder."""
    ok = True
    short, long_, prefill = seqs
    theirs = forward_logits(model, short, dev)
    mine = mesanet_logits(a.mesanet, a.backend, folder, short, os.path.join(work, f"{tag}-short.f32"))
    ok &= compare(f"{what}, one forward within the window", theirs, mine, a.tol, a.agree)
    theirs = local_logits(model, long_, model.config.attention_window_size, dev)
    mine = mesanet_logits(a.mesanet, a.backend, folder, long_, os.path.join(work, f"{tag}-long.f32"))
    ok &= compare(f"{what}, one forward of {len(long_)} tokens past the window (local mask)", theirs, mine, a.tol,
                  a.agree)
    # transformers' own decoding, against its own forward (information, not a check of mesanet: with
    # transformers 5.17 it disagrees with its forward, and fails where lru_width != hidden_size).
    # mesanet's decoding equals its forward in its own tests (the conformance battery).
    steps = short[:-1]
    try:
        stepped = step_logits(model, steps, prefill, dev)
        whole = forward_logits(model, steps, dev)
        err = float(np.linalg.norm(stepped - whole) / max(np.linalg.norm(whole), 1e-30))
        print(f"  (information) transformers' decoding (prefill {prefill}, then a token a step to {len(steps)}) "
              f"against its own forward: rel err {err:.2e}")
    except Exception as e:  # noqa: BLE001 (transformers' failure is what is reported)
        print(f"  (information) transformers' decoding (prefill {prefill}, then steps) fails: "
              f"{type(e).__name__}: {str(e).splitlines()[0]}")
    return ok


def load_hf(folder, dev):
    from transformers import RecurrentGemmaForCausalLM
    loaded, info = RecurrentGemmaForCausalLM.from_pretrained(folder, output_loading_info=True, dtype=torch.float32)
    bad = {k: v for k, v in info.items() if v}
    print(f"  transformers' from_pretrained: loading info "
          f"{bad if bad else 'clean (no missing / unexpected / mismatched tensors)'}")
    ok = not info.get("missing_keys") and not info.get("unexpected_keys") and not info.get("mismatched_keys")
    loaded.to(dev).eval()
    print(f"  loaded: {describe(loaded)}")
    return loaded, ok


def check_case(a, work, data, dev, i, fields):
    from transformers import RecurrentGemmaForCausalLM
    ok = True
    base = os.path.join(work, f"case{i}")
    os.makedirs(base, exist_ok=True)
    cfg = make_config(fields)
    torch.manual_seed(i)
    model = RecurrentGemmaForCausalLM(cfg).float()
    randomize(model, 100 + i)
    model.to(dev).eval()
    print(f"  transformers' model: {describe(model)}")
    hf_dir = os.path.join(base, "hf")
    shutil.rmtree(hf_dir, ignore_errors=True)
    model.save_pretrained(hf_dir, safe_serialization=True)
    if i == 0:
        keys = sorted(k for k in model.state_dict() if k.startswith("model.layers.0.") or k.startswith("model.layers.2."))
        print(f"  transformers' tensors of layers 0 and 2: {keys}")
        print(f"  its config.json: {json.load(open(os.path.join(hf_dir, 'config.json')))}")
    W = fields["attention_window_size"]
    rng = np.random.default_rng(i)
    seqs = ([int(t) for t in rng.integers(0, VOCAB, W)], [int(t) for t in rng.integers(0, VOCAB, 3 * W + 5)], 6)
    ok &= compare_all("(a) transformers' checkpoint: mesanet vs transformers", model, hf_dir, a, base, seqs, dev, "a")

    # (b) our folder, other random weights under our names
    ours = os.path.join(base, "ours")
    shutil.rmtree(ours, ignore_errors=True)
    subprocess.run([a.mesanet, "export", hf_dir, ours, "--format", "hf"], check=True, stdout=subprocess.DEVNULL)
    randomize_file(os.path.join(ours, "model.safetensors"), 200 + i)
    saved = json.load(open(os.path.join(ours, "config.json")))
    saved.pop("mesanet", None)
    print(f"  mesanet's config.json (its Hugging Face part): {saved}")
    loaded, good = load_hf(ours, dev)
    ok &= good
    ok &= compare_all("(b) mesanet's export: transformers vs mesanet", loaded, ours, a, base, seqs, dev, "b")

    # (b') a checkpoint as training saves it
    run = os.path.join(base, "run")
    shutil.rmtree(run, ignore_errors=True)
    subprocess.run([a.mesanet, "train", "--config", os.path.join(hf_dir, "config.json"), "--data", data, "--out", run,
                    "--steps", "1", "--batch", "2", "--seq", "64", "--warmup", "0", "--eval-batches", "1",
                    "--backend", a.backend, "--no-resume"], check=True, stdout=subprocess.DEVNULL)
    loaded, good = load_hf(run, dev)
    ok &= good
    ok &= compare_all("(b') mesanet's trained checkpoint: transformers vs mesanet", loaded, run, a, base, seqs, dev,
                      "c")
    return ok


def guarded(fn, *args):
    """fn(*args), a failure printed with its traceback and counted (the other cases still run)."""
    try:
        return fn(*args)
    except Exception:  # noqa: BLE001 (a report, not a program: every failure is printed)
        import traceback
        traceback.print_exc()
        print("  FAILED (exception)", flush=True)
        return False


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("work", nargs="?", default="runs/rgemma-check")
    ap.add_argument("--mesanet", default=os.path.join(ROOT, "build", "mesanet"))
    ap.add_argument("--backend", default="cpu", help="mesanet's backend: cpu, ref or cuda")
    a = ap.parse_args()
    a.tol, a.agree = (3e-2, 0.9) if a.backend == "cuda" else (1e-4, 0.99)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    work = os.path.abspath(a.work)
    data = os.path.join(work, "data")
    os.makedirs(data, exist_ok=True)
    stream = np.random.default_rng(0).integers(0, VOCAB, 20000)
    write_shard(os.path.join(data, "train.bin"), stream, VOCAB, 0)
    write_shard(os.path.join(data, "valid.bin"), stream[:2000], VOCAB, 0)
    import transformers
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, device {dev}, mesanet backend "
          f"{a.backend}; tolerance rel err {a.tol:g}, argmax agreement {a.agree}")
    ok = True
    for i, (name, fields) in enumerate(CASES):
        print(f"RecurrentGemmaForCausalLM, {name}", flush=True)
        ok &= guarded(check_case, a, work, data, dev, i, fields)
    print("all match" if ok else "SOME FAILED")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
