"""Times fla's MesaNetForCausalLM and GatedDeltaNetForCausalLM (the peer models): their training step
beside `mesanet bench train`, and with --decode their generation steps beside `mesanet bench decode`.

Measurement tooling for the comparison only; nothing of fla is part of mesanet.
fla's source is not committed: copy its `fla/` folder into `.fla/` (git-ignored)
and run on the GPU machine:

    python3 bench/fla_model_bench.py fla-162m fla-412m
    python3 bench/fla_model_bench.py --steps 20 fla-412m    (timed training steps; default 5)
    python3 bench/fla_model_bench.py --decode fla-162m
    python3 bench/fla_model_bench.py gdn-162m gdn-412m            (fla's Gated DeltaNet models)
    python3 bench/fla_model_bench.py --write-config gdn-162m DIR  (DIR/config.json: the same model
                                                                   for `mesanet bench train --config`)

The Gated DeltaNet models (gdn-162m, gdn-412m) are fla's GatedDeltaNetForCausalLM with its own layer
(mesanet's `gdn-paper` mixer, which reads fla's config.json as the same architecture): heads of 128,
expand_v 1 (value heads of 128 too), the output gate, short convolutions, fla's MLP width.

Decoding: bf16 weights, a 16-token prompt with the cache, then 64 single-token steps per run for
B = 1, 16, 128 sequences, each step ending with the last token's logits on the host (as ours);
fla's decoding runs its max_cg_step_decoding = 30 CG steps; the median of 3 runs.

The configs are those of our `fla-162m` and `fla-412m` presets (the same
architecture and tensors: bench/fla_compat.py checks it), trained as ours is:
fp32 master weights with bf16 autocast, AdamW, batch 8 x 2048 random tokens,
30 CG steps; tokens/s over the timed steps after two warm-up steps, peak memory
as PyTorch allocated it and the device memory in use after the steps (total less free, as ours is
measured: PyTorch's cache and the CUDA context included), and MFU as 6 x (parameters less the untied input
embedding) x tokens/s over the bf16 matrix-product rate measured in the same run.
"""
import os
import sys

os.environ.setdefault("FLA_DISABLE_BACKEND_DISPATCH", "1")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".fla"))

import torch  # noqa: E402
import triton  # noqa: E402

from fla.models.gated_deltanet import GatedDeltaNetConfig, GatedDeltaNetForCausalLM  # noqa: E402
from fla.models.mesa_net import MesaNetConfig, MesaNetForCausalLM  # noqa: E402
from peers import decode_step_ms, train_step_times  # noqa: E402

PRESETS = {  # our presets (src/model/presets.c) in fla's terms
    "fla-162m": dict(hidden_size=768, num_hidden_layers=12, num_heads=6),
    "fla-412m": dict(hidden_size=1024, num_hidden_layers=24, num_heads=8),
    "gdn-162m": dict(hidden_size=768, num_hidden_layers=12, num_heads=6),
    "gdn-412m": dict(hidden_size=1024, num_hidden_layers=24, num_heads=8),
}


def config(name):
    p = PRESETS[name]
    d = p["hidden_size"]
    if name.startswith("gdn-"):
        return GatedDeltaNetConfig(**p, head_dim=128, expand_v=1.0, use_gate=True, use_short_conv=True, conv_size=4,
                                   vocab_size=50304, hidden_ratio=4, hidden_act="swish", norm_eps=1e-6,
                                   tie_word_embeddings=False, max_position_embeddings=2048, fuse_norm=True,
                                   fuse_swiglu=True, fuse_cross_entropy=True)
    return MesaNetConfig(**p, head_dim=128, vocab_size=50304, intermediate_size=256 * ((d * 8 // 3 + 255) // 256),
                         hidden_ratio=4, hidden_act="swish", norm_eps=1e-6, tie_word_embeddings=False,
                         use_output_gate=False, use_short_conv=True, conv_size=4, lambda_lower_bound=0.25,
                         max_cg_step_training=30, max_cg_step_decoding=30, max_position_embeddings=2048,
                         fuse_norm=True, fuse_swiglu=True, fuse_cross_entropy=True)


def bypass_hopper_guard():
    """fla refuses its gated backward (chunk_bwd_dqkwg, which GatedDeltaNet's training runs) on Hopper
    with Triton >= 3.4.0 and < 3.7.1 (fla issue 640: known wrong gradients). For timing only, lift
    that guard as bench/fla_lin_bench.py does (chunk_o's IS_NVIDIA_HOPPER, read at call time) and
    say so: the time is that of kernels whose gradients are wrong here."""
    import fla.ops.common.chunk_o as chunk_o
    if getattr(chunk_o, "IS_NVIDIA_HOPPER", False):
        chunk_o.IS_NVIDIA_HOPPER = False
        print("WARNING: fla's gated backward is refused on this Hopper + Triton (fla issue 640, wrong gradients); "
              "the guard is bypassed to time GatedDeltaNet's training step", flush=True)


def model_class(name):
    return GatedDeltaNetForCausalLM if name.startswith("gdn-") else MesaNetForCausalLM


def bench(name, batch=8, seq=2048, steps=5, ceiling=None):
    torch.manual_seed(0)
    if name.startswith("gdn-"):
        bypass_hopper_guard()
    model = model_class(name)(config(name)).cuda()
    n_params = sum(p.numel() for p in model.parameters())
    dense = n_params - model.get_input_embeddings().weight.numel()
    dt, peak, in_use = train_step_times(model, batch, seq, steps)
    tps = batch * seq / dt
    mfu = 6 * dense * tps / (ceiling * 1e12)
    print(f"fla {name} ({n_params} parameters), batch {batch} x {seq}: {tps:.0f} tokens/s, {1e3 * dt:.1f} ms/step, "
          f"peak memory {peak:.2f} GB, device memory in use {in_use:.2f} GB, MFU {100 * mfu:.1f}%",
          flush=True)
    del model


def bench_decode(name, batches=(1, 16, 128), prompt=16, tokens=64, reps=3):
    torch.manual_seed(0)
    model = model_class(name)(config(name)).cuda().to(torch.bfloat16).eval()
    n_params = sum(p.numel() for p in model.parameters())
    print(f"fla {name} ({n_params} parameters) decoding: {prompt}-token prompt, then {tokens} steps per run "
          f"(median of {reps}), logits to the host every step", flush=True)
    for B in batches:
        try:
            ms = decode_step_ms(model, B, prompt, tokens, reps)
            print(f"  B={B:4d}: {ms:.3f} ms/step, {1e3 * B / ms:.0f} tokens/s", flush=True)
        except Exception as e:  # fla's layer squeezes the batch dimension when decoding: one sequence only
            print(f"  B={B:4d}: failed: {type(e).__name__}: {str(e)[:200]}", flush=True)
    del model


def main():
    steps = 5
    if sys.argv[1:2] == ["--write-config"]:
        if len(sys.argv) != 4 or sys.argv[2] not in PRESETS:
            sys.exit(f"fla_model_bench.py: --write-config NAME DIR, NAME one of {', '.join(PRESETS)}")
        os.makedirs(sys.argv[3], exist_ok=True)
        config(sys.argv[2]).to_json_file(os.path.join(sys.argv[3], "config.json"))
        print(f"wrote {os.path.join(sys.argv[3], 'config.json')}")
        return
    if sys.argv[1:2] == ["--steps"]:
        if len(sys.argv) < 3 or not sys.argv[2].isdigit() or int(sys.argv[2]) < 1:
            sys.exit("fla_model_bench.py: --steps: expected a positive number of timed steps")
        steps = int(sys.argv[2])
        del sys.argv[1:3]
    if sys.argv[1:2] == ["--decode"]:
        print(f"fla's models on {torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}")
        for name in sys.argv[2:] or ["fla-162m"]:
            try:
                bench_decode(name)
            except Exception as e:  # report and go on
                print(f"fla {name} decoding: failed: {type(e).__name__}: {str(e)[:300]}", flush=True)
        return

    print(f"fla's models on {torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}")
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    ms = triton.testing.do_bench(lambda: a @ a, return_mode="median")
    ceiling = 2 * 8192**3 / ms / 1e9
    print(f"bf16 matrix product 8192^3: {ceiling:.0f} TFLOP/s")
    del a
    torch.cuda.empty_cache()  # each model's device memory starts from the CUDA context alone
    for name in sys.argv[1:] or ["fla-162m", "fla-412m"]:
        try:
            bench(name, steps=steps, ceiling=ceiling)
        except Exception as e:  # report and go on (out of memory, a kernel fla refuses)
            print(f"fla {name}: failed: {type(e).__name__}: {str(e)[:200]}", flush=True)
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
