"""What the peer scripts (bench/fla_*.py, bench/hf_*.py) share: timing a PyTorch model's training
step and its decoding steps as `mesanet bench train` / `bench decode` time ours, and the pieces of
the checkpoint round trips (a mesanet token shard, `mesanet logits`, the logits' comparison).

Measurement tooling for the comparisons only. Imported by those scripts (run as
`python3 bench/NAME.py`, which puts bench/ on the import path); torch is imported where needed, so
that the round-trip helpers work without it.
"""
import struct
import subprocess
import time

import numpy as np


def train_step_times(model, batch, seq, steps, vocab=50304):
    """Times `steps` training steps after two warm-up steps, as ours are trained: fp32 master
    weights with bf16 autocast, fused AdamW, gradient clipping at 1, random tokens. Returns
    (mean seconds a step, peak memory PyTorch allocated in GB, device memory in use in GB: total
    less free, PyTorch's cache and the CUDA context included)."""
    import torch
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.95), weight_decay=0.1, fused=True)
    tok = torch.randint(0, vocab, (batch, seq), device="cuda")
    torch.cuda.reset_peak_memory_stats()
    times = []
    for s in range(steps + 2):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(input_ids=tok, labels=tok).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        if s >= 2:
            times.append(time.perf_counter() - t0)
    free, total = torch.cuda.mem_get_info()
    del opt
    return sum(times) / len(times), torch.cuda.max_memory_allocated() / 1e9, (total - free) / 1e9


def decode_step_ms(model, B, prompt, tokens, reps, vocab=50304):
    """The median over `reps` runs (after one warm-up run) of the milliseconds a decoding step takes:
    a `prompt`-token prefill with the cache, then `tokens` single-token steps, each ending with the
    last token's logits on the host (as ours)."""
    import torch
    times = []
    with torch.no_grad():
        for rep in range(reps + 1):
            tok = torch.randint(0, vocab, (B, prompt), device="cuda")
            out = model(input_ids=tok, use_cache=True, logits_to_keep=1)
            cache, nxt = out.past_key_values, tok[:, -1:]
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for s in range(tokens):
                nxt = (nxt + 7 * s + 1) % vocab
                out = model(input_ids=nxt, past_key_values=cache, use_cache=True, logits_to_keep=1)
                cache = out.past_key_values
                out.logits[:, -1].cpu()
            if rep:
                times.append((time.perf_counter() - t0) / tokens)
            del out, cache
    times.sort()
    return 1e3 * times[len(times) // 2]


def write_shard(path, tokens, vocab, bos):
    """A mesanet token shard (docs/data.md section 2)."""
    head = struct.pack("<IIIIQI", 0x4D4E5348, 1, vocab, 2 if vocab <= 65536 else 4, len(tokens), bos)
    head += b"\0" * (64 - len(head))
    with open(path, "wb") as f:
        f.write(head)
        f.write(np.asarray(tokens, dtype="<u2" if vocab <= 65536 else "<u4").tobytes())


def mesanet_logits(exe, backend, model_dir, tokens, out):
    """`mesanet logits` of a checkpoint directory: [len(tokens), V] float32."""
    subprocess.run([exe, "logits", "--model", model_dir, "--tokens", ",".join(map(str, tokens)), "--out", out,
                    "--backend", backend], check=True)
    return np.fromfile(out, dtype=np.float32).reshape(len(tokens), -1)


def compare(what, theirs, mine, tol, min_agree=0.99):
    """Prints the max abs difference, the relative (Frobenius) error and the argmax agreement of two
    logit arrays; True where rel err <= tol and the agreement >= min_agree."""
    diff = np.abs(theirs - mine).max()
    rel = np.linalg.norm(theirs - mine) / np.linalg.norm(mine)
    agree = (theirs.argmax(-1) == mine.argmax(-1)).mean()
    ok = rel <= tol and agree >= min_agree
    print(f"  {what}, {len(mine)} tokens: max abs diff {diff:.3e}, rel err {rel:.2e}, argmax agreement {agree:.3f}"
          f" (logits max |x| {np.abs(mine).max():.2f}){'' if ok else '  FAILED'}", flush=True)
    return ok
