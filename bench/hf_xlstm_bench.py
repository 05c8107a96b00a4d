"""Times the xLSTM peer models beside `mesanet bench train` and `mesanet bench decode` of our presets:

    hf-7b-160m     Hugging Face's xLSTMForCausalLM (transformers' own code: its native PyTorch mLSTM
                   kernels) at the sizes of our preset xlstm-7b-160m (the xLSTM-7B design at 160M)
    nxai-7b-160m   NX-AI's xLSTMLarge (the xlstm package's xlstm_large: the same architecture, with
                   mlstm_kernels' Triton kernels, chunkwise--triton_xl_chunk), the same sizes
    nxai-125m      NX-AI's xLSTMLMModel at the sizes of our preset xlstm-125m (xLSTM[7:1]: 24 blocks,
                   sLSTM at blocks 3 and 20; mLSTM backend parallel, sLSTM backend cuda)

Measurement tooling for the comparison only. transformers comes from the machine; the xlstm package
and mlstm_kernels are imported from .peers/ (git-ignored, never committed: see
bench/xlstm_kernels_bench.py), and a model whose code does not import is reported and skipped.
transformers is imported BEFORE .peers/ is put on the import path, so that xLSTMForCausalLM runs its
own native code (transformers takes the xlstm package's layers only where it is installed).

    python3 bench/hf_xlstm_bench.py train [MODEL ...] [--steps 5] [--mode eager|compiled|both] [--bin build/mesanet]
    python3 bench/hf_xlstm_bench.py decode [MODEL ...] [--batch 1,16,128] [--prompt 16] [--tokens 128]
    python3 bench/hf_xlstm_bench.py params [--bin build/mesanet]        (no GPU needed)

Training as ours is trained (bench/peers.py): fp32 master weights with bf16 autocast, fused AdamW,
clipping at 1, random tokens, batch 8 x 2048; tokens/s over the timed steps after two warm-up steps,
the peak memory PyTorch allocated and the device memory in use (total less free). --mode compiled
(or both) times the model under torch.compile (its first two steps, which compile, are reported apart).

Decoding: bf16 weights, a --prompt-token random prompt, then --tokens new tokens, greedy, at each
--batch: Hugging Face's generate with its recurrent cache (the whole call, prefill included; the
median of --reps after a warm-up call), and a step loop (the prefill, then single-token steps through
the cache, argmax on the device, the last token's logits to the host each step as ours) whose steps
alone are timed, as `mesanet bench decode` times ours. NX-AI's models decode through their step().

Parameter counts: each model's, beside ours as `mesanet info` counts it (--bin).
"""
import argparse
import os
import re
import statistics
import subprocess
import sys
import time

PEERS = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".peers"))

# Our presets (src/model/presets.c; `mesanet info NAME`) in the peers' terms.
PRESETS = {
    "xlstm-7b-160m": dict(vocab=50304, dim=768, blocks=12, heads=4, qk_dim_factor=0.5, v_dim_factor=1.0,
                          ffn_proj_factor=2.667, ffn_round=64, gate_cap=15.0, logit_cap=30.0, eps=1e-6, norm_eps=1e-6),
    "xlstm-125m": dict(vocab=50304, dim=768, blocks=24, heads=4, slstm_at=[3, 20], slstm_heads=4, conv=4,
                       qkv_blocksize=4, proj_factor=2.0, ffn_proj_factor=1.3, context=2048),
}
MODELS = {"hf-7b-160m": "xlstm-7b-160m", "nxai-7b-160m": "xlstm-7b-160m", "nxai-125m": "xlstm-125m"}
DEFAULT_MODELS = ["hf-7b-160m", "nxai-7b-160m", "nxai-125m"]


def ours_params(binary, preset):
    """The total of `mesanet info PRESET` (None where the binary is missing or says otherwise)."""
    if not binary or not os.access(binary, os.X_OK):
        return None
    try:
        out = subprocess.run([binary, "info", preset], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    m = re.search(r"^\s*total\s+(\d+)", out, re.M)
    return int(m.group(1)) if m else None


# --- the models ---------------------------------------------------------------------------------

def hf_model(mode):
    from transformers import xLSTMConfig, xLSTMForCausalLM  # main() imported transformers before .peers: the top
    p = PRESETS["xlstm-7b-160m"]
    cfg = xLSTMConfig(vocab_size=p["vocab"], hidden_size=p["dim"], embedding_dim=p["dim"], num_hidden_layers=p["blocks"],
                      num_blocks=p["blocks"], num_heads=p["heads"], qk_dim_factor=p["qk_dim_factor"],
                      v_dim_factor=p["v_dim_factor"], ffn_proj_factor=p["ffn_proj_factor"],
                      ffn_round_up_to_multiple_of=p["ffn_round"], gate_soft_cap=p["gate_cap"],
                      output_logit_soft_cap=p["logit_cap"], eps=p["eps"], norm_eps=p["norm_eps"], use_bias=False,
                      weight_mode="single", tie_word_embeddings=False, mode=mode, chunk_size=64,
                      return_last_states=True, use_cache=mode == "inference")
    import torch
    torch.manual_seed(0)
    return xLSTMForCausalLM(cfg)


def peers_on_path():
    if PEERS not in sys.path:
        sys.path.insert(0, PEERS)


def nxai_large_model(mode):
    peers_on_path()
    from xlstm.xlstm_large.model import xLSTMLarge, xLSTMLargeConfig
    p = PRESETS["xlstm-7b-160m"]
    cfg = xLSTMLargeConfig(embedding_dim=p["dim"], num_heads=p["heads"], num_blocks=p["blocks"], vocab_size=p["vocab"],
                           use_bias=False, norm_eps=p["norm_eps"], qk_dim_factor=p["qk_dim_factor"],
                           v_dim_factor=p["v_dim_factor"], gate_soft_cap=p["gate_cap"],
                           output_logit_soft_cap=p["logit_cap"], weight_mode="single",
                           ffn_proj_factor=p["ffn_proj_factor"], ffn_round_up_to_multiple_of=p["ffn_round"],
                           chunkwise_kernel="chunkwise--triton_xl_chunk", sequence_kernel="native_sequence__triton",
                           step_kernel="triton", mode=mode, chunk_size=128, return_last_states=True,
                           autocast_kernel_dtype="bfloat16", eps=p["eps"], inference_state_dtype="float32")
    import torch
    torch.manual_seed(0)
    return xLSTMLarge(cfg)


def nxai_125m_model(slstm_backend="cuda", slstm_at=None):
    """xLSTMLMModel at xlstm-125m's sizes (slstm_at: the sLSTM blocks, default the preset's)."""
    peers_on_path()
    from xlstm import (FeedForwardConfig, mLSTMBlockConfig, mLSTMLayerConfig, sLSTMBlockConfig, sLSTMLayerConfig,
                       xLSTMLMModel, xLSTMLMModelConfig)
    p = PRESETS["xlstm-125m"]
    cfg = xLSTMLMModelConfig(
        mlstm_block=mLSTMBlockConfig(mlstm=mLSTMLayerConfig(conv1d_kernel_size=p["conv"], proj_factor=p["proj_factor"],
                                                            qkv_proj_blocksize=p["qkv_blocksize"], num_heads=p["heads"])),
        slstm_block=sLSTMBlockConfig(slstm=sLSTMLayerConfig(backend=slstm_backend, num_heads=p["slstm_heads"],
                                                            conv1d_kernel_size=p["conv"],
                                                            bias_init="powerlaw_blockdependent"),
                                     feedforward=FeedForwardConfig(proj_factor=p["ffn_proj_factor"], act_fn="gelu")),
        context_length=p["context"], num_blocks=p["blocks"], embedding_dim=p["dim"],
        slstm_at=p["slstm_at"] if slstm_at is None else slstm_at, vocab_size=p["vocab"], tie_weights=False,
        add_post_blocks_norm=True, bias=False)
    import torch
    torch.manual_seed(0)
    m = xLSTMLMModel(cfg)
    m.reset_parameters()
    return m


def build(name, mode="train", slstm_backend="cuda"):
    """(model, loss(model, tokens) -> scalar, logits(model, tokens) -> [B, T, V]); the output of the
    sLSTM's CUDA build (at the model's construction) goes to stderr."""
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)  # file descriptors: torch's extension builder runs the compiler as a child process
    try:
        return build_(name, mode, slstm_backend)
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


def build_(name, mode, slstm_backend):
    import torch.nn.functional as F

    def ce(logits, tok):
        return F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]).float(), tok[:, 1:].reshape(-1))

    if name == "hf-7b-160m":
        return (hf_model(mode), lambda m, tok: m(input_ids=tok, labels=tok, use_cache=False).loss,
                lambda m, tok: m(input_ids=tok, use_cache=False).logits)
    if name == "nxai-7b-160m":
        def logits(m, tok):
            out = m(tok)
            return out[0] if isinstance(out, tuple) else out
        return nxai_large_model(mode), lambda m, tok: ce(logits(m, tok), tok), logits
    if name == "nxai-125m":
        return nxai_125m_model(slstm_backend), lambda m, tok: ce(m(tok), tok), lambda m, tok: m(tok)
    raise ValueError(name)


# --- training ------------------------------------------------------------------------------------

def train_times(model, loss_fn, batch, seq, steps, vocab):
    """As bench/peers.py's train_step_times, with the model's own loss: (seconds a step, the first two
    steps' seconds, peak GB allocated, device GB in use)."""
    import torch
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.95), weight_decay=0.1, fused=True)
    tok = torch.randint(0, vocab, (batch, seq), device="cuda")
    torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(steps + 2):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = loss_fn(model, tok)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    free, total = torch.cuda.mem_get_info()
    del opt
    timed = times[2:]
    return sum(timed) / len(timed), times[:2], torch.cuda.max_memory_allocated() / 1e9, (total - free) / 1e9


def bench_train(name, steps, mode, batch=8, seq=2048, ours=None):
    import torch
    model, loss_fn, _ = build(name, "train")
    model = model.cuda()
    n = sum(p.numel() for p in model.parameters())
    preset = MODELS[name]
    theirs_vs = f", ours ({preset}, mesanet info): {ours}{' (same)' if ours == n else ''}" if ours else ""
    print(f"{name} ({n} parameters{theirs_vs})", flush=True)
    variants = ([("eager", model)] if mode != "compiled" else []) + ([("compiled", None)] if mode != "eager" else [])
    for label, m in variants:
        try:
            if m is None:
                m = torch.compile(model)
            dt, first, peak, in_use = train_times(m, loss_fn, batch, seq, steps, PRESETS[preset]["vocab"])
        except Exception as e:  # noqa: BLE001 (report and go on: out of memory, a kernel that does not build)
            print(f"{name} train {label}, batch {batch} x {seq}: failed: {type(e).__name__}: {str(e)[:300]}", flush=True)
            torch.cuda.empty_cache()
            continue
        print(f"{name} train {label}, batch {batch} x {seq}: {batch * seq / dt:.0f} tokens/s, {1e3 * dt:.1f} ms/step, "
              f"peak memory {peak:.2f} GB, device memory in use {in_use:.2f} GB (first two steps {first[0]:.1f} s, "
              f"{first[1]:.1f} s)", flush=True)
        torch.cuda.empty_cache()
    del model
    torch.cuda.empty_cache()


# --- decoding ------------------------------------------------------------------------------------

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


def hf_generate_ms(model, B, prompt, tokens, vocab, reps):
    """The median milliseconds of one greedy generate call of `tokens` new tokens (prefill included)."""
    import torch
    tok = torch.randint(0, vocab, (B, prompt), device="cuda")
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


def step_loop_ms(name, model, B, prompt, tokens, vocab, reps):
    """Milliseconds a decoding step (the median of reps runs after a warm-up): the prompt's prefill
    (HF: one call with the cache; NX-AI: through step()), then `tokens` single-token steps, each
    ending with the next tokens by argmax and the logits of the step on the host."""
    import torch
    ts = []
    with torch.no_grad():
        for rep in range(reps + 1):
            tok = torch.randint(0, vocab, (B, prompt), device="cuda")
            if name.startswith("hf-"):
                out = model(input_ids=tok, use_cache=True)
                cache, logits = out.cache_params, out.logits
            elif name == "nxai-7b-160m":
                logits, cache = model(tok)  # mode "inference" returns the last states
            else:
                cache = None
                for t in range(prompt):
                    logits, cache = model.step(tok[:, t:t + 1], cache)
            nxt = logits[:, -1:].argmax(-1)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(tokens):
                if name.startswith("hf-"):
                    out = model(input_ids=nxt, cache_params=cache, use_cache=True)
                    logits, cache = out.logits, out.cache_params
                elif name == "nxai-7b-160m":
                    logits, cache = model(nxt, state=cache)
                else:
                    logits, cache = model.step(nxt, cache)
                nxt = logits[:, -1:].argmax(-1)
                logits[:, -1].float().cpu()
            if rep:
                ts.append((time.perf_counter() - t0) / tokens)
    return 1e3 * statistics.median(ts)


def bench_decode(name, batches, prompt, tokens, reps, ours=None):
    import torch
    model, _, _ = build(name, "inference")
    model = model.cuda().to(torch.bfloat16).eval()
    n = sum(p.numel() for p in model.parameters())
    vocab = PRESETS[MODELS[name]]["vocab"]
    print(f"{name} ({n} parameters{f', ours {ours}' if ours else ''}) decoding: {prompt}-token prompt, {tokens} new "
          f"tokens, greedy, bf16 weights; median of {reps} after a warm-up", flush=True)
    for B in batches:
        parts = []
        if name.startswith("hf-"):
            try:
                ms = hf_generate_ms(model, B, prompt, tokens, vocab, reps)
                parts.append(f"generate {ms / tokens:.3f} ms/token, {1e3 * B * tokens / ms:.0f} tokens/s (prefill included)")
            except Exception as e:  # noqa: BLE001
                parts.append(f"generate failed: {type(e).__name__}: {str(e)[:200]}")
        try:
            ms = step_loop_ms(name, model, B, prompt, tokens, vocab, reps)
            parts.append(f"steps {ms:.3f} ms/step, {1e3 * B / ms:.0f} tokens/s")
        except Exception as e:  # noqa: BLE001
            parts.append(f"steps failed: {type(e).__name__}: {str(e)[:200]}")
        print(f"{name} decode B={B:4d}: " + "; ".join(parts), flush=True)
        torch.cuda.empty_cache()
    del model
    torch.cuda.empty_cache()


def print_params(binary):
    """Each model's parameter count (built without storage where it can, else on the CPU; no GPU
    needed) beside ours."""
    import torch
    for name in DEFAULT_MODELS:
        ours = ours_params(binary, MODELS[name])
        model = None
        for device in ("meta", "cpu"):
            try:
                with torch.device(device):
                    model = build(name, "train", slstm_backend="vanilla")[0]  # the same tensors, no CUDA build
                break
            except Exception as e:  # noqa: BLE001
                err = e
        if model is None:
            print(f"{name}: cannot build: {type(err).__name__}: {str(err)[:300]}", flush=True)
            continue
        n = sum(p.numel() for p in model.parameters())
        same = "" if ours is None else (" (the same)" if ours == n else f" (DIFFERENT by {n - ours:+d})")
        print(f"{name}: {n} parameters; ours ({MODELS[name]}): {ours if ours is not None else 'n/a'}{same}", flush=True)
        del model


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("what", choices=["train", "decode", "params"])
    ap.add_argument("models", nargs="*", help=f"of {', '.join(MODELS)} (default all)")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--mode", choices=["eager", "compiled", "both"], default="eager",
                    help="train the model as it is, under torch.compile, or both")
    ap.add_argument("--batch", default="1,16,128")
    ap.add_argument("--prompt", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--bin", default="build/mesanet", help="our binary, for `mesanet info`'s parameter counts")
    a = ap.parse_args()
    models = a.models or DEFAULT_MODELS
    for m in models:
        if m not in MODELS:
            sys.exit(f"hf_xlstm_bench.py: unknown model '{m}' ({', '.join(MODELS)})")
    batches = [int(x) for x in a.batch.split(",") if x]
    if a.steps < 1 or a.prompt < 1 or a.tokens < 1 or a.reps < 1 or not batches or min(batches) < 1:
        sys.exit("hf_xlstm_bench.py: --steps, --prompt, --tokens, --reps and --batch must be positive")
    import torch
    import transformers  # before .peers/ is on the path (see the top)
    if a.what == "params":
        print_params(a.bin)
        return
    if not torch.cuda.is_available():
        sys.exit("hf_xlstm_bench.py: no CUDA device")
    print(f"xLSTM peer models on {torch.cuda.get_device_name()}, torch {torch.__version__}, transformers "
          f"{transformers.__version__}", flush=True)
    for name in models:
        ours = ours_params(a.bin, MODELS[name])
        try:
            if a.what == "train":
                bench_train(name, a.steps, a.mode, ours=ours)
            else:
                bench_decode(name, batches, a.prompt, a.tokens, a.reps, ours=ours)
        except Exception as e:  # noqa: BLE001 (a model whose code does not import or build)
            print(f"{name}: failed: {type(e).__name__}: {str(e)[:300]}", flush=True)
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
