"""Times Hugging Face's RecurrentGemmaForCausalLM at the sizes of our preset griffin-160m (Griffin:
recurrent, recurrent, local attention, in turn), beside `mesanet bench train` / `bench decode` of ours:

    python3 bench/hf_rgemma_bench.py train [--steps 3] [--bin build/mesanet]
    python3 bench/hf_rgemma_bench.py decode [--batch 1,16,128] [--prompt 16] [--tokens 128] [--reps 2]
    python3 bench/hf_rgemma_bench.py params [--bin build/mesanet]        (no GPU needed)

Measurement tooling for the comparison only; transformers and torch come from the machine.

Training as ours is trained (bench/peers.py's train_step_times): fp32 master weights with bf16
autocast, fused AdamW, clipping at 1, random tokens, batch 8 x 2048 (use_cache=False); tokens/s over
the timed steps after two warm-up steps, the peak memory PyTorch allocated and the device memory in
use. transformers runs the RG-LRU as a Python loop over the tokens (its _rnn_scan), and its training
forward's attention mask is causal only (no window past attention_window_size), so its attention
layers do more work than ours (local, 1024 tokens) at 2048 tokens.

Decoding: bf16 weights, a --prompt-token random prompt, then --tokens new tokens, greedy, at each
--batch: generate (the whole call, prefill included; the median of --reps after a warm-up call), and a
step loop (the prefill with the cache, then single-token calls with their cache_position, argmax on
the device, the step's logits to the host each step as ours) whose steps alone are timed, as
`mesanet bench decode` times ours. RecurrentGemma keeps its cache inside its layers (no
past_key_values): each call continues from the last.
"""
import argparse
import inspect
import os
import re
import statistics
import subprocess
import sys
import time

# griffin-160m (src/model/presets.c; `mesanet info griffin-160m`) in transformers' terms
PRESET = dict(vocab_size=50304, hidden_size=768, num_hidden_layers=17, num_attention_heads=6, num_key_value_heads=1,
              lru_width=768, intermediate_size=2 * 3 * 768, attention_window_size=1024, conv1d_width=4,
              logits_soft_cap=30.0, rms_norm_eps=1e-6, block_types=["recurrent", "recurrent", "attention"],
              tie_word_embeddings=True)
THETA = 10000.0


def ours_params(binary):
    """The total of `mesanet info griffin-160m` (None where the binary is missing or says otherwise)."""
    if not binary or not os.access(binary, os.X_OK):
        return None
    try:
        out = subprocess.run([binary, "info", "griffin-160m"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    m = re.search(r"^\s*total\s+(\d+)", out, re.M)
    return int(m.group(1)) if m else None


def hf_model():
    import torch
    from transformers import RecurrentGemmaConfig, RecurrentGemmaForCausalLM
    f = dict(PRESET)
    if "rope_parameters" in inspect.signature(RecurrentGemmaConfig.__init__).parameters:
        f["rope_parameters"] = {"rope_type": "default", "rope_theta": THETA, "partial_rotary_factor": 0.5}
    else:
        f.update(rope_theta=THETA, partial_rotary_factor=0.5)
    torch.manual_seed(0)
    return RecurrentGemmaForCausalLM(RecurrentGemmaConfig(**f))


def bench_train(steps, ours):
    import torch
    from peers import train_step_times
    model = hf_model().cuda()
    model.config.use_cache = False
    n = sum(p.numel() for p in model.parameters())
    print(f"hf-griffin-160m ({n} parameters{f', ours (griffin-160m, mesanet info): {ours}' if ours else ''})",
          flush=True)
    batch, seq = 8, 2048
    try:
        dt, peak, in_use = train_step_times(model, batch, seq, steps, vocab=PRESET["vocab_size"])
        print(f"hf-griffin-160m train eager, batch {batch} x {seq}: {batch * seq / dt:.0f} tokens/s, {1e3 * dt:.1f} "
              f"ms/step, peak memory {peak:.2f} GB, device memory in use {in_use:.2f} GB", flush=True)
    except Exception as e:  # noqa: BLE001 (report and go on: out of memory)
        print(f"hf-griffin-160m train eager, batch {batch} x {seq}: failed: {type(e).__name__}: {str(e)[:300]}",
              flush=True)
    del model
    torch.cuda.empty_cache()


def median_ms(fn, reps):
    import torch
    fn()  # warm-up
    ts = []
    for _ in range(reps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        ts.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(ts)


def generate_ms(model, B, prompt, tokens, reps):
    import torch
    tok = torch.randint(0, PRESET["vocab_size"], (B, prompt), device="cuda")
    made = []

    def run():
        with torch.no_grad():
            out = model.generate(input_ids=tok, max_new_tokens=tokens, min_new_tokens=tokens, do_sample=False,
                                 use_cache=True, pad_token_id=0)
        made.append(out.shape[1] - prompt)

    ms = median_ms(run, reps)
    if made[-1] != tokens:
        raise RuntimeError(f"generate made {made[-1]} tokens, not {tokens}")
    return ms


def step_loop_ms(model, B, prompt, tokens, reps):
    import torch
    ts = []
    with torch.no_grad():
        for rep in range(reps + 1):
            tok = torch.randint(0, PRESET["vocab_size"], (B, prompt), device="cuda")
            logits = model(input_ids=tok, use_cache=True).logits
            nxt = logits[:, -1:].argmax(-1)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for s in range(tokens):
                pos = torch.tensor([prompt + s], device="cuda")
                logits = model(input_ids=nxt, cache_position=pos, use_cache=True).logits
                nxt = logits[:, -1:].argmax(-1)
                logits[:, -1].float().cpu()
            if rep:
                ts.append((time.perf_counter() - t0) / tokens)
    return 1e3 * statistics.median(ts)


def bench_decode(batches, prompt, tokens, reps, ours):
    import torch
    model = hf_model().cuda().to(torch.bfloat16).eval()
    n = sum(p.numel() for p in model.parameters())
    print(f"hf-griffin-160m ({n} parameters{f', ours {ours}' if ours else ''}) decoding: {prompt}-token prompt, "
          f"{tokens} new tokens, greedy, bf16 weights; median of {reps} after a warm-up", flush=True)
    for B in batches:
        parts = []
        try:
            ms = generate_ms(model, B, prompt, tokens, reps)
            parts.append(f"generate {ms / tokens:.3f} ms/token, {1e3 * B * tokens / ms:.0f} tokens/s (prefill included)")
        except Exception as e:  # noqa: BLE001
            parts.append(f"generate failed: {type(e).__name__}: {str(e)[:200]}")
        try:
            ms = step_loop_ms(model, B, prompt, tokens, reps)
            parts.append(f"steps {ms:.3f} ms/step, {1e3 * B / ms:.0f} tokens/s")
        except Exception as e:  # noqa: BLE001
            parts.append(f"steps failed: {type(e).__name__}: {str(e)[:200]}")
        print(f"hf-griffin-160m decode B={B:4d}: " + "; ".join(parts), flush=True)
        torch.cuda.empty_cache()
    del model
    torch.cuda.empty_cache()


def print_params(binary):
    import torch
    ours = ours_params(binary)
    with torch.device("meta"):
        model = hf_model()
    n = sum(p.numel() for p in model.parameters())
    same = "" if ours is None else (" (the same)" if ours == n else f" (DIFFERENT by {n - ours:+d})")
    print(f"hf-griffin-160m: {n} parameters; ours (griffin-160m): {ours if ours is not None else 'n/a'}{same}",
          flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("what", choices=["train", "decode", "params"])
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--batch", default="1,16,128")
    ap.add_argument("--prompt", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--bin", default="build/mesanet", help="our binary, for `mesanet info`'s parameter count")
    a = ap.parse_args()
    batches = [int(x) for x in a.batch.split(",") if x]
    if a.steps < 1 or a.prompt < 1 or a.tokens < 1 or a.reps < 1 or not batches or min(batches) < 1:
        sys.exit("hf_rgemma_bench.py: --steps, --prompt, --tokens, --reps and --batch must be positive")
    import torch
    import transformers
    if a.what == "params":
        print_params(a.bin)
        return
    if not torch.cuda.is_available():
        sys.exit("hf_rgemma_bench.py: no CUDA device")
    print(f"RecurrentGemmaForCausalLM on {torch.cuda.get_device_name()}, torch {torch.__version__}, transformers "
          f"{transformers.__version__}", flush=True)
    ours = ours_params(a.bin)
    if a.what == "train":
        bench_train(a.steps, ours)
    else:
        bench_decode(batches, a.prompt, a.tokens, a.reps, ours)


if __name__ == "__main__":
    main()
