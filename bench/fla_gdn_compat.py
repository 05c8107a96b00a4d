"""Checkpoint compatibility with fla's GatedDeltaNetForCausalLM and DeltaNetForCausalLM (mesanet's
`gdn-paper` and `deltanet-paper` mixers with the fla architecture), both ways.

Run on a machine with torch, transformers, safetensors and a GPU (fla's Triton kernels), from the
repository root, fla's source in `.fla/` (not committed) and `build/mesanet` built:

    python3 bench/fla_gdn_compat.py [WORK_DIR] [--mesanet build/mesanet] [--backend cpu]

For each of a few tiny configs (fla's defaults for each model, and variants: no output gate,
allow_neg_eigval, expand_v):

(a) fla -> mesanet: fla builds a random model (its own initialisation, then every weight
    perturbed so that the logits are far from uniform), saves it with save_pretrained
    (config.json + model.safetensors, float32); `mesanet logits --model DIR` loads it and its
    logits are compared with fla's, in float32.
(b) mesanet -> fla: `mesanet train --config <fla's config.json> --steps 1` (on a small random
    token shard this script writes) makes a mesanet checkpoint; fla loads it with from_pretrained
    (the missing and unexpected tensors are printed: both should be empty) and its logits are
    compared with `mesanet logits` of the same run.

Prints, per config and direction, the max abs difference of the logits, their relative error
(Frobenius) and the argmax agreement; exits 1 if any direction fails (missing / unexpected tensors,
rel err above 1e-4 on the float32 recurrent path (48 tokens) or 5e-3 on fla's chunk kernels (100
tokens, GDN only: TF32 dots), or argmax agreement < 0.99).
"""
import argparse
import json
import os
import shutil
import subprocess
import sys

os.environ.setdefault("FLA_DISABLE_BACKEND_DISPATCH", "1")
ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, os.path.join(ROOT, ".fla"))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from fla.models.delta_net import DeltaNetConfig, DeltaNetForCausalLM  # noqa: E402
from fla.models.gated_deltanet import GatedDeltaNetConfig, GatedDeltaNetForCausalLM  # noqa: E402
from peers import compare, mesanet_logits, write_shard  # noqa: E402

VOCAB = 1000
# fla's layers in eval mode run fused_recurrent (float32 throughout) on 64 tokens or fewer and their
# chunk kernels (Triton dots in TF32: about 1e-3 relative) on more; DeltaNet's chunk kernel refuses
# float32, so its models are compared on the short sequence only.
T_SHORT, T_LONG = 48, 100
TOL = {T_SHORT: 1e-4, T_LONG: 5e-3}

# (name, model class, config class, config fields)
CASES = [
    ("gdn default", GatedDeltaNetForCausalLM, GatedDeltaNetConfig,
     dict(hidden_size=256, num_heads=4, head_dim=64, expand_v=2.0, num_hidden_layers=2, use_gate=True)),
    ("gdn no gate, neg eigval, expand_v 1", GatedDeltaNetForCausalLM, GatedDeltaNetConfig,
     dict(hidden_size=256, num_heads=2, head_dim=128, expand_v=1.0, num_hidden_layers=2, use_gate=False,
          allow_neg_eigval=True)),
    ("deltanet default", DeltaNetForCausalLM, DeltaNetConfig,
     dict(hidden_size=256, num_heads=4, expand_k=1.0, expand_v=1.0, num_hidden_layers=2, use_gate=False)),
    ("deltanet gate, neg eigval, expand_v 2", DeltaNetForCausalLM, DeltaNetConfig,
     dict(hidden_size=256, num_heads=4, expand_k=1.0, expand_v=2.0, num_hidden_layers=2, use_gate=True,
          allow_neg_eigval=True)),
]


def fla_logits(model, tokens):
    with torch.no_grad():
        return model(torch.tensor([tokens], device="cuda")).logits[0].float().cpu().numpy()


def perturb(model, seed):
    """Every weight random at a scale that carries signal through the layers (fla's 0.02 leaves
    the logits nearly uniform, where the argmax says little); A_log and dt_bias keep fla's
    initialisation."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("A_log") or name.endswith("dt_bias"):
                continue
            if "norm" in name:
                p.copy_(1 + 0.1 * torch.randn(p.shape, generator=g))
            else:
                fan_in = p.shape[-1] if p.dim() > 1 else 1
                p.copy_(torch.randn(p.shape, generator=g) / np.sqrt(fan_in))


def save_fla(model, path):
    """save_pretrained (config.json + model.safetensors); where this transformers cannot save fla's
    model, the same files by hand: the config's save_pretrained and the state_dict in safetensors."""
    try:
        model.save_pretrained(path, safe_serialization=True)
        return
    except Exception as e:  # transformers 5 expects _tied_weights_keys as a dict; fla's is a list
        print(f"  (save_pretrained failed: {type(e).__name__}: {e}; saving config.json and model.safetensors by hand)")
    from safetensors.torch import save_file
    os.makedirs(path, exist_ok=True)
    model.config.save_pretrained(path)
    save_file({k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()},
              os.path.join(path, "model.safetensors"), metadata={"format": "pt"})


def load_fla(model_cls, cfg_cls, path):
    """from_pretrained with its loading info; where this transformers cannot, the model of the
    directory's config.json with the weights of model.safetensors loaded non-strictly (missing and
    unexpected tensors reported the same way)."""
    try:
        return model_cls.from_pretrained(path, output_loading_info=True, dtype=torch.float32)
    except Exception as e:
        print(f"  (from_pretrained failed: {type(e).__name__}: {e}; loading by hand)")
    from safetensors.torch import load_file
    model = model_cls(cfg_cls.from_pretrained(path)).float()
    state = load_file(os.path.join(path, "model.safetensors"))
    own = model.state_dict()
    mismatched = [k for k, v in state.items() if k in own and tuple(own[k].shape) != tuple(v.shape)]
    missing, unexpected = model.load_state_dict({k: v for k, v in state.items() if k not in mismatched}, strict=False)
    return model, {"missing_keys": list(missing), "unexpected_keys": list(unexpected), "mismatched_keys": mismatched}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("work", nargs="?", default="runs/fla-gdn-compat")
    ap.add_argument("--mesanet", default=os.path.join(ROOT, "build", "mesanet"))
    ap.add_argument("--backend", default="cpu", help="mesanet's backend: cpu, ref or cuda")
    args = ap.parse_args()
    work = os.path.abspath(args.work)
    os.makedirs(work, exist_ok=True)
    rng = np.random.default_rng(0)
    long_tokens = [int(t) for t in rng.integers(0, VOCAB, T_LONG)]
    data = os.path.join(work, "data")
    os.makedirs(data, exist_ok=True)
    stream = rng.integers(0, VOCAB, 20000)
    write_shard(os.path.join(data, "train.bin"), stream, VOCAB, 0)
    write_shard(os.path.join(data, "valid.bin"), stream[:2000], VOCAB, 0)
    all_ok = True
    for i, (name, model_cls, cfg_cls, fields) in enumerate(CASES):
        print(f"{name}: {fields}")
        slug = f"case{i}"
        cfg = cfg_cls(vocab_size=VOCAB, tie_word_embeddings=False, fuse_cross_entropy=False, **fields)

        # (a) fla -> mesanet
        torch.manual_seed(i)
        model = model_cls(cfg).float()
        perturb(model, 100 + i)
        model = model.cuda().eval()
        fla_dir = os.path.join(work, slug, "fla")
        shutil.rmtree(fla_dir, ignore_errors=True)
        save_fla(model, fla_dir)
        lengths = [T_SHORT, T_LONG] if model_cls is GatedDeltaNetForCausalLM else [T_SHORT]
        for n in lengths:
            tokens = long_tokens[:n]
            theirs = fla_logits(model, tokens)
            mine = mesanet_logits(args.mesanet, args.backend, fla_dir, tokens,
                                  os.path.join(work, slug, f"fla.logits{n}.f32"))
            all_ok &= compare("(a) fla's checkpoint, mesanet vs fla", theirs, mine, TOL[n])

        # (b) mesanet -> fla: one training step from fla's config.json, then fla's from_pretrained
        run = os.path.join(work, slug, "mesanet-run")
        shutil.rmtree(run, ignore_errors=True)
        subprocess.run([args.mesanet, "train", "--config", os.path.join(fla_dir, "config.json"), "--data", data,
                        "--out", run, "--steps", "1", "--batch", "2", "--seq", "128", "--warmup", "0",
                        "--eval-batches", "1", "--backend", args.backend, "--no-resume"], check=True,
                       stdout=subprocess.DEVNULL)
        saved = json.load(open(os.path.join(run, "config.json")))
        print(f"  mesanet's config.json: model_type {saved.get('model_type')}, architectures {saved.get('architectures')}")
        loaded, info = load_fla(model_cls, cfg_cls, run)
        bad = {k: v for k, v in info.items() if v}
        print(f"  (b) fla's from_pretrained of mesanet's run: {sum(1 for _ in loaded.parameters())} tensors, "
              f"loading info {bad if bad else 'clean (no missing / unexpected / mismatched tensors)'}")
        all_ok &= not info.get("missing_keys") and not info.get("unexpected_keys") and not info.get("mismatched_keys")
        loaded = loaded.cuda().eval()
        for n in lengths:
            tokens = long_tokens[:n]
            theirs = fla_logits(loaded, tokens)
            mine = mesanet_logits(args.mesanet, args.backend, run, tokens, os.path.join(work, slug, f"run.logits{n}.f32"))
            all_ok &= compare("(b) mesanet's checkpoint, fla vs mesanet", theirs, mine, TOL[n])
    print("all match" if all_ok else "SOME FAILED")
    sys.exit(0 if all_ok else 1)


if __name__ == "__main__":
    main()
