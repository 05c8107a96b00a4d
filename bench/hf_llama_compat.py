"""Checkpoint compatibility with Hugging Face's LlamaForCausalLM and MistralForCausalLM (mesanet's
`llama` architecture: mixer mha, or swa for Mistral's sliding window), both ways.

Run where torch, transformers and safetensors are installed (the GPU machine), from the repository
root with `build/mesanet` built:

    python3 bench/hf_llama_compat.py [WORK_DIR] [--mesanet build/mesanet] [--backend cpu|cuda]

For each of a few tiny configs (grouped key/value heads, a tied head, a large RoPE theta, a sliding
window shorter than the sequence):

(a) transformers -> mesanet: transformers builds a random model (every weight at a scale that
    carries signal through the layers), saves it with save_pretrained (config.json +
    model.safetensors, float32); `mesanet logits --model DIR` loads it and its logits are compared
    with transformers' (eager attention, float32, on the CPU).
(b) mesanet -> transformers: `mesanet train --config <that config.json> --steps 1` makes a mesanet
    checkpoint; transformers loads it with from_pretrained (missing and unexpected tensors
    printed: both should be empty) and its logits are compared with `mesanet logits` of the run.

Prints, per config and direction, the max abs difference of the logits, their relative error
(Frobenius) and the argmax agreement; exits 1 if any direction fails: missing / unexpected tensors,
rel err above 1e-4 (mesanet's float32 CPU backend; 3e-2 with --backend cuda, whose activations are
bf16), or argmax agreement below 0.99 (0.9 on cuda).
"""
import argparse
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import torch
from transformers import LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM

from peers import compare, mesanet_logits, write_shard

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
VOCAB, T = 1000, 100

# (name, model class, config class, config fields)
CASES = [
    ("llama, grouped kv heads", LlamaForCausalLM, LlamaConfig,
     dict(hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
          head_dim=64, tie_word_embeddings=False)),
    ("llama, tied head, theta 5e5, head 32", LlamaForCausalLM, LlamaConfig,
     dict(hidden_size=256, intermediate_size=384, num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=8,
          head_dim=32, tie_word_embeddings=True, rope_theta=500000.0)),
    ("mistral, sliding window 16", MistralForCausalLM, MistralConfig,
     dict(hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=1,
          head_dim=64, sliding_window=16, tie_word_embeddings=False)),
]


def hf_logits(model, tokens):
    with torch.no_grad():
        return model(torch.tensor([tokens])).logits[0].float().numpy()


def perturb(model, seed):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1 + 0.1 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(torch.randn(p.shape, generator=g) / np.sqrt(p.shape[-1] if p.dim() > 1 else 1))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("work", nargs="?", default="runs/hf-llama-compat")
    ap.add_argument("--mesanet", default=os.path.join(ROOT, "build", "mesanet"))
    ap.add_argument("--backend", default="cpu", help="mesanet's backend: cpu, ref or cuda")
    a = ap.parse_args()
    tol, min_agree = (3e-2, 0.9) if a.backend == "cuda" else (1e-4, 0.99)
    work = os.path.abspath(a.work)
    data = os.path.join(work, "data")
    os.makedirs(data, exist_ok=True)
    rng = np.random.default_rng(0)
    tokens = [int(t) for t in rng.integers(0, VOCAB, T)]
    stream = rng.integers(0, VOCAB, 20000)
    write_shard(os.path.join(data, "train.bin"), stream, VOCAB, 0)
    write_shard(os.path.join(data, "valid.bin"), stream[:2000], VOCAB, 0)
    import transformers
    print(f"transformers {transformers.__version__}, torch {torch.__version__}; mesanet backend {a.backend}")
    all_ok = True
    for i, (name, model_cls, cfg_cls, fields) in enumerate(CASES):
        print(f"{name}: {fields}", flush=True)
        slug = f"case{i}"
        cfg = cfg_cls(vocab_size=VOCAB, max_position_embeddings=256, **fields)
        torch.manual_seed(i)
        model = model_cls._from_config(cfg, attn_implementation="eager", dtype=torch.float32)
        perturb(model, 100 + i)
        model.eval()
        hf_dir = os.path.join(work, slug, "hf")
        shutil.rmtree(hf_dir, ignore_errors=True)
        model.save_pretrained(hf_dir, safe_serialization=True)
        theirs = hf_logits(model, tokens)
        mine = mesanet_logits(a.mesanet, a.backend, hf_dir, tokens, os.path.join(work, slug, "hf.logits.f32"))
        all_ok &= compare("(a) transformers' checkpoint, mesanet vs transformers", theirs, mine, tol, min_agree)

        run = os.path.join(work, slug, "mesanet-run")
        shutil.rmtree(run, ignore_errors=True)
        subprocess.run([a.mesanet, "train", "--config", os.path.join(hf_dir, "config.json"), "--data", data, "--out",
                        run, "--steps", "1", "--batch", "2", "--seq", "128", "--warmup", "0", "--eval-batches", "1",
                        "--backend", a.backend, "--no-resume"], check=True, stdout=subprocess.DEVNULL)
        saved = json.load(open(os.path.join(run, "config.json")))
        print(f"  mesanet's config.json: model_type {saved.get('model_type')}, architectures "
              f"{saved.get('architectures')}, sliding_window {saved.get('sliding_window')}")
        loaded, info = model_cls.from_pretrained(run, output_loading_info=True, dtype=torch.float32,
                                                 attn_implementation="eager")
        bad = {k: v for k, v in info.items() if v}
        print(f"  (b) transformers' from_pretrained of mesanet's run: loading info "
              f"{bad if bad else 'clean (no missing / unexpected / mismatched tensors)'}")
        all_ok &= not info.get("missing_keys") and not info.get("unexpected_keys") and not info.get("mismatched_keys")
        all_ok &= type(loaded) is model_cls
        loaded.eval()
        theirs = hf_logits(loaded, tokens)
        mine = mesanet_logits(a.mesanet, a.backend, run, tokens, os.path.join(work, slug, "run.logits.f32"))
        all_ok &= compare("(b) mesanet's checkpoint, transformers vs mesanet", theirs, mine, tol, min_agree)
    print("all match" if all_ok else "SOME FAILED")
    sys.exit(0 if all_ok else 1)


if __name__ == "__main__":
    main()
