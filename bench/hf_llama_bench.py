"""Times Hugging Face's LlamaForCausalLM (the Transformer peer) beside `mesanet bench train` and
`mesanet bench decode` on the same architecture (issue: the Transformer baselines).

Measurement tooling for the comparison only. Run on the GPU machine (torch and transformers
installed there), from the repository root:

    python3 bench/hf_llama_bench.py --write-config DIR [--size 160m]   (the config.json ours reads)
    python3 bench/hf_llama_bench.py [--size 160m] [--steps 5]          (training)
    python3 bench/hf_llama_bench.py --decode [--size 160m]             (decoding with its KV cache)

The model: a Llama of the given size (160m: hidden 768, 12 layers, 6 heads of 128, MLP 2048,
vocabulary 50304, untied head, about 162M parameters), attention through SDPA. `--write-config DIR`
writes DIR/config.json, which `mesanet bench train --config DIR/config.json` reads as the same
architecture (mesanet's `llama` architecture: Llama's tensors and computation).

Training as ours is timed: fp32 master weights with bf16 autocast, fused AdamW, clipping, batch
8 x 2048 random tokens; tokens/s over the timed steps after two warm-up steps, peak memory as
PyTorch allocated it, the device memory in use (total less free).

Decoding: bf16 weights, a prompt of --prompt tokens (default 2048) with the cache, then 64
single-token steps per run for B = 1, 16, 128, each step ending with the last token's logits on
the host (as ours); the median of 3 runs.
"""
import argparse
import json
import os
import sys

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from peers import decode_step_ms, train_step_times

SIZES = {
    "160m": dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=6, head_dim=128, intermediate_size=2048),
    "400m": dict(hidden_size=1024, num_hidden_layers=24, num_attention_heads=8, head_dim=128, intermediate_size=2816),
}


def config(size):
    return LlamaConfig(**SIZES[size], num_key_value_heads=SIZES[size]["num_attention_heads"], vocab_size=50304,
                       tie_word_embeddings=False, rms_norm_eps=1e-6, rope_theta=10000.0, max_position_embeddings=8192,
                       hidden_act="silu", attention_bias=False, mlp_bias=False)


def write_config(size, path):
    os.makedirs(path, exist_ok=True)
    d = config(size).to_dict()
    d["architectures"] = ["LlamaForCausalLM"]
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(d, f, indent=2)
    print(f"wrote {os.path.join(path, 'config.json')}")


def model(size, dtype):
    torch.manual_seed(0)
    m = LlamaForCausalLM._from_config(config(size), attn_implementation="sdpa", dtype=dtype)
    return m.cuda()


def bench_train(size, batch, seq, steps):
    m = model(size, torch.float32)
    n_params = sum(p.numel() for p in m.parameters())
    dt, peak, in_use = train_step_times(m, batch, seq, steps)
    print(f"HF Llama {size} ({n_params} parameters), batch {batch} x {seq}: {batch * seq / dt:.0f} tokens/s, "
          f"{1e3 * dt:.1f} ms/step, peak memory {peak:.2f} GB, device memory in use {in_use:.2f} GB", flush=True)
    del m


def bench_decode(size, batches, prompt, tokens=64, reps=3):
    m = model(size, torch.bfloat16).eval()
    print(f"HF Llama {size} decoding: {prompt}-token prompt, then {tokens} steps per run (median of {reps}), "
          f"logits to the host every step", flush=True)
    for B in batches:
        try:
            ms = decode_step_ms(m, B, prompt, tokens, reps)
            print(f"  B={B:4d}: {ms:.3f} ms/step, {1e3 * B / ms:.0f} tokens/s", flush=True)
        except Exception as e:  # out of memory at a large batch: say so and go on
            print(f"  B={B:4d}: failed: {type(e).__name__}: {str(e)[:200]}", flush=True)
        torch.cuda.empty_cache()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", default="160m", choices=sorted(SIZES))
    ap.add_argument("--write-config", metavar="DIR")
    ap.add_argument("--decode", action="store_true")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--prompt", type=int, default=2048)
    a = ap.parse_args()
    if a.steps < 1 or a.prompt < 1:
        sys.exit("hf_llama_bench.py: --steps and --prompt must be positive")
    if a.write_config:
        write_config(a.size, a.write_config)
        return
    import transformers
    print(f"Hugging Face Llama on {torch.cuda.get_device_name()}, torch {torch.__version__}, "
          f"transformers {transformers.__version__}, SDPA attention")
    if a.decode:
        bench_decode(a.size, (1, 16, 128), a.prompt)
    else:
        bench_train(a.size, 8, 2048, a.steps)


if __name__ == "__main__":
    main()
