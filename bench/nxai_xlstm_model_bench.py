"""Trains NX-AI's xLSTMLMModel (the xlstm package) at the xLSTM paper's 125M size, xLSTM[7:1], with
the fastest kernels of NX-AI's that run here, beside `mesanet bench train --config xlstm-125m`:

    nxai-125m-tfla      xLSTMLMModel at our preset xlstm-125m's sizes (bench/hf_xlstm_bench.py's
                        PRESETS: embedding 768, 24 blocks, sLSTM at blocks 3 and 20, mLSTM blocks of
                        4 heads over 2 x 768 (heads of 384), sLSTM 4 heads, GeLU MLP 1.3 x 768, no
                        bias, untied head); each mLSTM cell's parallel form swapped for mlstm_kernels'
                        TFLA chunkwise kernel (--mlstm-kernel, default chunkwise--triton_xl_chunk,
                        chunk 128; bf16 q, k, v inside); the sLSTM backend "vanilla" (PyTorch, a step
                        at a time): the xlstm package's sLSTM CUDA kernel does not build with this
                        machine's nvcc 13 and torch 2.11 (bench/results/xlstm-models-h200.txt)
    nxai10-125m-tfla    xLSTM[1:0] at 125M, mLSTM blocks only (our preset xlstm10-125m): the same
                        TFLA kernel, no sLSTM, so that the mLSTM side is compared without the vanilla
                        sLSTM's cost
    nxai-125m-parallel  xLSTM[7:1] as the package makes it: the mLSTM's parallel (quadratic) form,
                        sLSTM "vanilla"

Measurement tooling for the comparison only: the xlstm package and mlstm_kernels are imported from
.peers/ (git-ignored, never committed: bench/xlstm_kernels_bench.py says how to make it); torch,
triton and einops come from the machine. Training as ours and bench/hf_xlstm_bench.py's: fp32 master
weights with bf16 autocast, fused AdamW, clipping at 1, random tokens, batch --batch x --seq (8 x
2048); tokens/s over --steps timed steps after two warm-up steps, the peak memory PyTorch allocated
and the device memory in use (total less free), printed as bench/xlstm_ratios.py reads them.

    python3 bench/nxai_xlstm_model_bench.py [--models nxai-125m-tfla,nxai10-125m-tfla,...] [--steps 5]
        [--batch 8] [--seq 2048] [--mlstm-kernel chunkwise--triton_xl_chunk] [--bin build/mesanet]
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_xlstm_bench as hx  # noqa: E402 (the model's config, the training loop, the parameter count of ours)

MODELS = {"nxai-125m-tfla": "xlstm-125m", "nxai10-125m-tfla": "xlstm10-125m", "nxai-125m-parallel": "xlstm-125m"}
CHUNK = {"chunkwise--triton_xl_chunk": 128, "chunkwise--triton_limit_chunk": 64}
EPS = 1e-6  # the mLSTM cell's (parallel_stabilized_simple's default, and mlstm_kernels')


def tfla_backend(kern, chunk):
    """An mLSTMCell backend_fn (the signature of the xlstm package's parallel_stabilized_simple: q, k,
    v [B, NH, S, DH], gate pre-activations [B, NH, S, 1]; h [B, NH, S, DH]) through an mlstm_kernels
    chunkwise kernel, which takes the gates as [B, NH, S], the forget gate's pre-activation as the
    parallel form does (logsigmoid inside), and scales q.k by DH^-1/2 as it does."""
    import torch

    def fn(queries, keys, values, igate_preact, fgate_preact, **_):
        return kern(q=queries, k=keys, v=values, i=igate_preact.squeeze(-1), f=fgate_preact.squeeze(-1),
                    return_last_states=False, eps=EPS, chunk_size=chunk, autocast_kernel_dtype=torch.bfloat16)
    return fn


def build(name, kernel):
    """(model on the GPU, its loss, a description of its kernels)."""
    import torch.nn.functional as F
    model = hx.nxai_125m_model(slstm_backend="vanilla", slstm_at=[] if name.startswith("nxai10") else None)
    what = "mLSTM parallel form (the package's), sLSTM vanilla"
    if name.endswith("-tfla"):
        hx.peers_on_path()
        from mlstm_kernels.torch import get_mlstm_kernel
        from xlstm.blocks.mlstm.cell import mLSTMCell
        fn = tfla_backend(get_mlstm_kernel(kernel), CHUNK[kernel])
        cells = [m for m in model.modules() if isinstance(m, mLSTMCell)]
        if not cells:
            raise RuntimeError("no mLSTMCell in the model (the xlstm package's layout changed?)")
        for c in cells:
            c.backend_fn = fn
        what = f"mLSTM {kernel} (mlstm_kernels' TFLA, chunk {CHUNK[kernel]}) in its {len(cells)} cells" + (
            "" if name.startswith("nxai10") else ", sLSTM vanilla")

    def loss(m, tok):
        logits = m(tok)
        return F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]).float(), tok[:, 1:].reshape(-1))
    return model.cuda(), loss, what


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="nxai-125m-tfla", help=f"of {', '.join(MODELS)}")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--mlstm-kernel", default="chunkwise--triton_xl_chunk", choices=sorted(CHUNK))
    ap.add_argument("--bin", default="build/mesanet", help="our binary, for `mesanet info`'s parameter count")
    a = ap.parse_args()
    models = [m for m in a.models.split(",") if m]
    for m in models:
        if m not in MODELS:
            sys.exit(f"nxai_xlstm_model_bench.py: --models: unknown '{m}' ({', '.join(MODELS)})")
    if a.steps < 1 or a.batch < 1 or a.seq < 1:
        sys.exit("nxai_xlstm_model_bench.py: --steps, --batch and --seq must be positive")
    if a.seq > hx.PRESETS["xlstm-125m"]["context"]:
        sys.exit(f"nxai_xlstm_model_bench.py: --seq {a.seq} is over the model's context, "
                 f"{hx.PRESETS['xlstm-125m']['context']}")
    import torch
    if not torch.cuda.is_available():
        sys.exit("nxai_xlstm_model_bench.py: no CUDA device")
    print(f"NX-AI's xLSTMLMModel at 125M on {torch.cuda.get_device_name()}, torch {torch.__version__}", flush=True)
    vocab = hx.PRESETS["xlstm-125m"]["vocab"]
    for name in models:
        ours = hx.ours_params(a.bin, MODELS[name])
        try:
            model, loss, what = build(name, a.mlstm_kernel)
            n = sum(p.numel() for p in model.parameters())
            same = "" if ours is None else f", ours ({MODELS[name]}, mesanet info): {ours}{' (same)' if ours == n else ''}"
            print(f"{name} ({n} parameters{same}): {what}", flush=True)
            dt, first, peak, in_use = hx.train_times(model, loss, a.batch, a.seq, a.steps, vocab)
        except Exception as e:  # noqa: BLE001 (report and go on: a kernel that does not import or build, memory)
            print(f"{name} train eager, batch {a.batch} x {a.seq}: failed: {type(e).__name__}: {str(e)[:300]}",
                  flush=True)
            torch.cuda.empty_cache()
            continue
        tps = a.batch * a.seq / dt
        print(f"{name} train eager, batch {a.batch} x {a.seq}: {tps:.0f} tokens/s, {1e3 * dt:.1f} ms/step, "
              f"peak memory {peak:.2f} GB, device memory in use {in_use:.2f} GB (first two steps {first[0]:.1f} s, "
              f"{first[1]:.1f} s)", flush=True)
        del model
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
