"""xLSTM checkpoints against the Python implementations, both ways: transformers' xLSTMForCausalLM
(mesanet's `xlstm` architecture) and NX-AI's xlstm package's xLSTMLMModel (mesanet's paper models of
mlstm-block / slstm-block mixers with LayerNorm).

NOT part of the C test suite (tests/test_xlstm_formats.c checks the formats on the CPU without
Python). It needs torch, transformers >= 5.2 (whose native xLSTM kernels run every sequence length)
and the source of NX-AI's xlstm package (github NX-AI/xlstm: its `xlstm/` folder, nothing compiled:
the vanilla sLSTM and the parallel mLSTM are plain PyTorch), and runs on the GPU machine:

    python3 bench/xlstm_check.py [WORK_DIR] --mesanet build/mesanet --peers .peers

where .peers holds the package's `xlstm/` folder. transformers is imported before the package is put
on the path, so that transformers runs its own copy of the xLSTM code (with the package importable it
would import NX-AI's xlstm_large and mlstm_kernels instead).

Every tensor of every model is random (the default initialisations zero the gates and the recurrent
kernel and would hide layout errors). The Python models run in float32 with TF32 off (matrix products
and cuDNN's convolutions), on the GPU where there is one; mesanet runs its float32 CPU backend
(`mesanet logits --backend cpu`).

(a) Python -> mesanet: each library builds a random model and saves it (transformers'
    save_pretrained; NX-AI's config.json = json.dump(dataclasses.asdict(config)) and
    safetensors.torch.save_model of the module, which keeps one name of a tied head); `mesanet logits`
    of that folder is compared with the library's logits, for sequences shorter than transformers'
    chunk of 64 (its recurrent kernel alone) and longer (chunkwise, then recurrent). NX-AI's folder is
    also written in the sLSTM CUDA backend's layout, converted with NX-AI's own functions
    (sLSTMCell_cuda with skip_backend_init: nothing compiled), and must give the same logits.
(b) mesanet -> Python: `mesanet export` makes our own folder of the model, whose weights are then
    replaced by other random ones under our names; transformers' from_pretrained loads it (missing /
    unexpected tensors printed: both must be empty), and `mesanet export --format nxai` writes NX-AI's
    folder, whose config.json is read back into NX-AI's dataclasses (dacite where installed, else
    field by field as dacite does) and whose state dict loads with load_state_dict(strict=True), in
    both sLSTM layouts (the CUDA one converted to the vanilla model with NX-AI's functions). Their
    logits are compared with `mesanet logits` of our folder. For transformers, the same weights are
    also written in its weight_mode "fused" (the tensors concatenated along their rows) and read by
    mesanet, which splits them on loading.

Tolerance: the relative (Frobenius) error of the logits at most 1e-4, the argmax agreeing at 99% of
positions. Both sides compute in float32 with sums of at most a few hundred terms per output, so
rounding alone leaves relative errors around 1e-6 to 1e-5; the only difference in the mathematics is
the mLSTM stabiliser's start (NX-AI's parallel form starts from -inf, mesanet and transformers from
0), which changes h by at most eps = 1e-6 relative. A layout error (a transposed kernel, a swapped
gate, an offset norm) moves the logits by O(1). Exits 1 if any comparison fails.
"""
import argparse
import dataclasses
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import torch

from peers import compare, mesanet_logits

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
TOL, AGREE = 1e-4, 0.99


def rand_like(name, shape, gen, offsets):
    """A random tensor for parameter `name`: norm weights around 1 (NX-AI's stored offsets around 0),
    matrices N(0, 1/fan-in), everything else N(0, 1)."""
    if "norm" in name:
        return (torch.rand(shape, generator=gen) - 0.5) if offsets else (0.5 + torch.rand(shape, generator=gen))
    if len(shape) > 1 and "embedding" not in name:
        return torch.randn(shape, generator=gen) / np.sqrt(shape[-1])
    return torch.randn(shape, generator=gen)


def randomize(model, seed, offsets):
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(rand_like(name, tuple(p.shape), gen, offsets))


def randomize_file(path, seed):
    """Replaces every tensor of a safetensors file (our names) by random values."""
    from safetensors.numpy import load_file, save_file
    gen = torch.Generator().manual_seed(seed)
    t = load_file(path)
    save_file({k: rand_like(k, v.shape, gen, False).numpy().astype(np.float32) for k, v in t.items()}, path,
              metadata={"format": "pt"})


def run(args):
    subprocess.run(args, check=True, stdout=subprocess.DEVNULL)


def torch_logits(model, tokens, dev, hf):
    with torch.no_grad():
        x = torch.tensor([tokens], device=dev)
        out = model(x, use_cache=False).logits if hf else model(x)
        return out[0].float().cpu().numpy()


# ---------------------------------------------------------------------------------- transformers

HF_CASES = [
    ("3 blocks, 4 heads (q/k 16, v 32), SwiGLU 384", dict(hidden_size=128, embedding_dim=128, num_hidden_layers=3,
                                                          num_blocks=3, num_heads=4)),
    ("2 blocks, 2 heads (q/k 12, v 24), SwiGLU 1.5 x 96 rounded to 32 = 160, no logit cap (if transformers takes it)",
     dict(hidden_size=96, embedding_dim=96, num_hidden_layers=2, num_blocks=2, num_heads=2, qk_dim_factor=0.25,
          v_dim_factor=0.5, ffn_proj_factor=1.5, ffn_round_up_to_multiple_of=32, output_logit_soft_cap=None)),
]


def fused_folder(src, dst):
    """Our folder of the xlstm architecture rewritten in transformers' weight_mode "fused"."""
    from safetensors.numpy import load_file, save_file
    os.makedirs(dst, exist_ok=True)
    cfg = json.load(open(os.path.join(src, "config.json")))
    cfg.pop("mesanet", None)
    cfg["weight_mode"] = "fused"
    json.dump(cfg, open(os.path.join(dst, "config.json"), "w"), indent=2)
    t = load_file(os.path.join(src, "model.safetensors"))
    out = {}
    for k, x in t.items():
        pre, _, rest = k.partition(".mlstm_layer.")
        if rest in ("q.weight", "k.weight", "v.weight", "ogate_preact.weight"):
            if rest == "q.weight":
                out[pre + ".mlstm_layer.qkv_opreact.weight"] = np.concatenate(
                    [t[pre + ".mlstm_layer." + n] for n in ("q.weight", "k.weight", "v.weight", "ogate_preact.weight")])
            continue
        if rest.startswith("igate_preact.") or rest.startswith("fgate_preact."):
            if rest.startswith("igate_preact."):
                s = rest.split(".")[1]
                out[pre + ".mlstm_layer.ifgate_preact." + s] = np.concatenate(
                    [t[pre + ".mlstm_layer.igate_preact." + s], t[pre + ".mlstm_layer.fgate_preact." + s]])
            continue
        pre2, _, rest2 = k.partition(".ffn.")
        if rest2 in ("proj_up_gate.weight", "proj_up.weight"):
            if rest2 == "proj_up.weight":
                out[pre2 + ".ffn.proj_up_gate_z.weight"] = np.concatenate(
                    [t[pre2 + ".ffn.proj_up_gate.weight"], t[pre2 + ".ffn.proj_up.weight"]])
            continue
        out[k] = x
    save_file(out, os.path.join(dst, "model.safetensors"), metadata={"format": "pt"})


def guarded(fn, *args):
    """fn(*args), a failure printed with its traceback and counted (the other checks still run)."""
    try:
        return fn(*args)
    except Exception:  # noqa: BLE001 (a report, not a program: every failure is printed)
        import traceback
        traceback.print_exc()
        print("  FAILED (exception)", flush=True)
        return False


def check_hf(a, work, seqs, dev):
    ok = True
    for i, (name, fields) in enumerate(HF_CASES):
        print(f"transformers xLSTMForCausalLM, {name}", flush=True)
        ok &= guarded(check_hf_case, a, work, seqs, dev, i, fields)
    return ok


def check_hf_case(a, work, seqs, dev, i, fields):
    from transformers import xLSTMConfig, xLSTMForCausalLM
    ok = True
    try:
        cfg = xLSTMConfig(vocab_size=a.vocab, mode="inference", weight_mode="single", tie_word_embeddings=False,
                          **fields)
    except Exception as e:  # noqa: BLE001 (transformers 5.17's strict config refuses a None cap: kept at 30)
        print(f"  transformers refuses output_logit_soft_cap None ({type(e).__name__}: "
              f"{str(e).splitlines()[-1].strip()}); 30.0 instead")
        fields = dict(fields, output_logit_soft_cap=30.0)
        cfg = xLSTMConfig(vocab_size=a.vocab, mode="inference", weight_mode="single", tie_word_embeddings=False,
                          **fields)
    torch.manual_seed(i)
    model = xLSTMForCausalLM(cfg).float()
    randomize(model, 1000 + i, offsets=False)
    model.to(dev).eval()
    hf_dir = os.path.join(work, f"hf{i}", "transformers")
    shutil.rmtree(hf_dir, ignore_errors=True)
    model.save_pretrained(hf_dir, safe_serialization=True)
    if i == 0:
        keys = sorted(k for k in model.state_dict() if ".blocks.0." in k)
        print(f"  transformers' tensors of block 0: {keys}")
        print(f"  its config.json: {json.load(open(os.path.join(hf_dir, 'config.json')))}")
    for s, tokens in seqs.items():
        theirs = torch_logits(model, tokens, dev, True)
        mine = mesanet_logits(a.mesanet, a.backend, hf_dir, tokens, os.path.join(work, f"hf{i}", f"a{s}.f32"))
        ok &= compare(f"(a) transformers' checkpoint, S={s}: mesanet vs transformers", theirs, mine, TOL, AGREE)
    # (b) our folder (our config.json writer), other random weights under our names
    ours = os.path.join(work, f"hf{i}", "ours")
    shutil.rmtree(ours, ignore_errors=True)
    run([a.mesanet, "export", hf_dir, ours, "--format", "hf"])
    randomize_file(os.path.join(ours, "model.safetensors"), 2000 + i)
    saved = json.load(open(os.path.join(ours, "config.json")))
    print(f"  mesanet's config.json: " + ", ".join(f"{k} {saved.get(k)}" for k in (
        "model_type", "hidden_size", "embedding_dim", "num_hidden_layers", "num_blocks", "qk_dim_factor",
        "v_dim_factor", "ffn_proj_factor", "ffn_round_up_to_multiple_of", "output_logit_soft_cap")))
    loaded, info = xLSTMForCausalLM.from_pretrained(ours, output_loading_info=True, dtype=torch.float32)
    bad = {k: v for k, v in info.items() if v}
    print(f"  (b) transformers' from_pretrained of mesanet's folder: loading info "
          f"{bad if bad else 'clean (no missing / unexpected / mismatched tensors)'}")
    ok &= not info.get("missing_keys") and not info.get("unexpected_keys") and not info.get("mismatched_keys")
    loaded.to(dev).eval()
    fused = os.path.join(work, f"hf{i}", "fused")
    fused_folder(ours, fused)
    for s, tokens in seqs.items():
        theirs = torch_logits(loaded, tokens, dev, True)
        mine = mesanet_logits(a.mesanet, a.backend, ours, tokens, os.path.join(work, f"hf{i}", f"b{s}.f32"))
        ok &= compare(f"(b) mesanet's checkpoint, S={s}: transformers vs mesanet", theirs, mine, TOL, AGREE)
        mf = mesanet_logits(a.mesanet, a.backend, fused, tokens, os.path.join(work, f"hf{i}", f"f{s}.f32"))
        ok &= compare(f"(b) the same in weight_mode fused, S={s}: transformers vs mesanet", theirs, mf, TOL, AGREE)
    return ok


# ---------------------------------------------------------------------------------- NX-AI's xlstm

def nxai_cases(x):
    """(name, config) of the NX-AI models checked."""
    return [
        ("4 blocks, sLSTM at 1, E 128: mLSTM 4 heads of 64, sLSTM 4 heads of 32, FFN 192, untied",
         x.xLSTMLMModelConfig(
             mlstm_block=x.mLSTMBlockConfig(mlstm=x.mLSTMLayerConfig(conv1d_kernel_size=4, qkv_proj_blocksize=4,
                                                                     num_heads=4)),
             slstm_block=x.sLSTMBlockConfig(slstm=x.sLSTMLayerConfig(backend="vanilla", num_heads=4,
                                                                     conv1d_kernel_size=4),
                                            feedforward=x.FeedForwardConfig(proj_factor=1.3, act_fn="gelu")),
             context_length=256, num_blocks=4, embedding_dim=128, slstm_at=[1], vocab_size=VOCAB, tie_weights=False)),
        ("3 blocks, sLSTM at 0 and 2, E 96, conv 3: mLSTM 2 heads of 96, sLSTM 2 heads of 48, FFN 128, tied",
         x.xLSTMLMModelConfig(
             mlstm_block=x.mLSTMBlockConfig(mlstm=x.mLSTMLayerConfig(conv1d_kernel_size=3, qkv_proj_blocksize=4,
                                                                     num_heads=2)),
             slstm_block=x.sLSTMBlockConfig(slstm=x.sLSTMLayerConfig(backend="vanilla", num_heads=2,
                                                                     conv1d_kernel_size=3),
                                            feedforward=x.FeedForwardConfig(proj_factor=1.3, act_fn="gelu")),
             context_length=256, num_blocks=3, embedding_dim=96, slstm_at=[0, 2], vocab_size=VOCAB, tie_weights=True)),
    ]


def nxai_config_from_dict(x, d):
    """NX-AI's config from its asdict dictionary: dacite.from_dict(strict) as its README does, or the
    same field by field (every key must be a field)."""
    try:
        import dacite
        return dacite.from_dict(x.xLSTMLMModelConfig, d, dacite.Config(strict=True)), "dacite"
    except ImportError:
        pass
    d = dict(d)
    mb, sb = d.pop("mlstm_block"), d.pop("slstm_block")
    m = None if mb is None else x.mLSTMBlockConfig(mlstm=x.mLSTMLayerConfig(**mb["mlstm"]), _num_blocks=mb["_num_blocks"],
                                                   _block_idx=mb["_block_idx"])
    s = None
    if sb is not None:
        ff = None if sb["feedforward"] is None else x.FeedForwardConfig(**sb["feedforward"])
        s = x.sLSTMBlockConfig(slstm=x.sLSTMLayerConfig(**sb["slstm"]), feedforward=ff, _num_blocks=sb["_num_blocks"],
                               _block_idx=sb["_block_idx"])
    return x.xLSTMLMModelConfig(mlstm_block=m, slstm_block=s, **d), "field by field (no dacite)"


def slstm_layer_configs(model):
    from xlstm.blocks.slstm.layer import sLSTMLayer
    return [(n, m) for n, m in model.named_modules() if isinstance(m, sLSTMLayer)]


def to_cuda_layout(x, model, sd):
    """The state dict of a vanilla-backend model in the sLSTM CUDA backend's layout, through NX-AI's
    own conversions (internal -> external -> internal)."""
    from xlstm.blocks.slstm.cell import sLSTMCell_cuda
    sd = dict(sd)
    for name, layer in slstm_layer_configs(model):
        cell = layer.slstm_cell
        cuda = sLSTMCell_cuda(dataclasses.replace(cell.config, backend="cuda"), skip_backend_init=True)
        k, b = name + ".slstm_cell._recurrent_kernel_", name + ".slstm_cell._bias_"
        sd[k] = cuda._recurrent_kernel_ext2int(cell._recurrent_kernel_int2ext(sd[k])).contiguous()
        sd[b] = cuda._bias_ext2int(cell._bias_int2ext(sd[b])).contiguous()
    return sd


def from_cuda_layout(model, sd):
    """The inverse: a CUDA-layout state dict for the vanilla model, through NX-AI's functions."""
    from xlstm.blocks.slstm.cell import sLSTMCell_cuda
    sd = dict(sd)
    for name, layer in slstm_layer_configs(model):
        cell = layer.slstm_cell
        cuda = sLSTMCell_cuda(dataclasses.replace(cell.config, backend="cuda"), skip_backend_init=True)
        k, b = name + ".slstm_cell._recurrent_kernel_", name + ".slstm_cell._bias_"
        sd[k] = cell._recurrent_kernel_ext2int(cuda._recurrent_kernel_int2ext(sd[k])).contiguous()
        sd[b] = cell._bias_ext2int(cuda._bias_int2ext(sd[b])).contiguous()
    return sd


def key_diff(a, b, path=""):
    """Keys of nested dicts present in one and not the other."""
    out = []
    for k in sorted(set(a) | set(b)):
        if k not in a or k not in b:
            out.append(path + k + (" (ours only)" if k in a else " (asdict only)"))
        elif isinstance(a[k], dict) and isinstance(b[k], dict) and k != "constants":
            out += key_diff(a[k], b[k], path + k + ".")
    return out


def check_nxai(a, work, seqs, dev):
    import xlstm as x
    ok = True
    for i, (name, cfg) in enumerate(nxai_cases(x)):
        print(f"NX-AI xLSTMLMModel, {name}", flush=True)
        ok &= guarded(check_nxai_case, a, work, seqs, dev, x, i, cfg)
    return ok


def check_nxai_case(a, work, seqs, dev, x, i, cfg):
    from safetensors.torch import load_file, save_file, save_model
    ok = True
    torch.manual_seed(i)
    model = x.xLSTMLMModel(cfg)
    randomize(model, 3000 + i, offsets=True)
    model.to(dev).eval()
    base = os.path.join(work, f"nxai{i}")
    van, cud = os.path.join(base, "vanilla"), os.path.join(base, "cuda")
    for d in (van, cud):
        shutil.rmtree(d, ignore_errors=True)
        os.makedirs(d)
    d = dataclasses.asdict(cfg)
    json.dump(d, open(os.path.join(van, "config.json"), "w"), indent=2)
    save_model(model, os.path.join(van, "model.safetensors"), metadata={"format": "pt"})
    dc = json.loads(json.dumps(d))
    dc["slstm_block"]["slstm"]["backend"] = "cuda"
    json.dump(dc, open(os.path.join(cud, "config.json"), "w"), indent=2)
    sd = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    if cfg.tie_weights:
        sd.pop("lm_head.weight")  # (as save_model keeps one name of the two)
    save_file(to_cuda_layout(x, model, sd), os.path.join(cud, "model.safetensors"), metadata={"format": "pt"})
    for s, tokens in seqs.items():
        theirs = torch_logits(model, tokens, dev, False)
        mine = mesanet_logits(a.mesanet, a.backend, van, tokens, os.path.join(base, f"a{s}.f32"))
        ok &= compare(f"(a) NX-AI's checkpoint (vanilla layout), S={s}: mesanet vs NX-AI", theirs, mine, TOL, AGREE)
        mc = mesanet_logits(a.mesanet, a.backend, cud, tokens, os.path.join(base, f"c{s}.f32"))
        same = np.array_equal(mc, mine)
        print(f"  (a) the CUDA layout (NX-AI's conversion) loads to the same logits bit for bit: {same}")
        ok &= same
    # (b) ours -> NX-AI: other random weights under our names, exported in both layouts
    ours = os.path.join(base, "ours")
    shutil.rmtree(ours, ignore_errors=True)
    run([a.mesanet, "export", van, ours, "--format", "hf"])
    randomize_file(os.path.join(ours, "model.safetensors"), 4000 + i)
    for layout in ("vanilla", "cuda"):
        out = os.path.join(base, "back-" + layout)
        shutil.rmtree(out, ignore_errors=True)
        run([a.mesanet, "export", ours, out, "--format", "nxai", "--slstm-layout", layout])
        written = json.load(open(os.path.join(out, "config.json")))
        cfg2, how = nxai_config_from_dict(x, json.loads(json.dumps(written)))
        diff = key_diff(written, dataclasses.asdict(cfg2))
        print(f"  (b) mesanet's config.json ({layout}) read by NX-AI's dataclasses ({how}); its keys against "
              f"asdict's: {'the same' if not diff else diff}")
        ok &= not diff
        backend = cfg2.slstm_block.slstm.backend if cfg2.slstm_block else None
        if cfg2.slstm_block:
            cfg2.slstm_block.slstm.backend = "vanilla"  # (the CUDA layout converted below: nothing compiled)
        m2 = x.xLSTMLMModel(cfg2)
        sd2 = load_file(os.path.join(out, "model.safetensors"))
        if backend == "cuda":
            sd2 = from_cuda_layout(m2, sd2)
        res = m2.load_state_dict(sd2, strict=True)
        print(f"  (b) load_state_dict(strict=True) of mesanet's {layout} export: {res}")
        m2.to(dev).eval()
        for s, tokens in seqs.items():
            theirs = torch_logits(m2, tokens, dev, False)
            mine = mesanet_logits(a.mesanet, a.backend, ours, tokens, os.path.join(base, f"b{s}.f32"))
            ok &= compare(f"(b) mesanet's checkpoint as NX-AI's ({layout}), S={s}: NX-AI vs mesanet", theirs, mine,
                          TOL, AGREE)
    return ok


VOCAB = 256


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("work", nargs="?", default="runs/xlstm-check")
    ap.add_argument("--mesanet", default=os.path.join(ROOT, "build", "mesanet"))
    ap.add_argument("--backend", default="cpu", help="mesanet's backend (cpu; ref is float64)")
    ap.add_argument("--peers", default=os.path.join(ROOT, ".peers"), help="the folder holding NX-AI's xlstm/ package")
    a = ap.parse_args()
    a.vocab = VOCAB
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    work = os.path.abspath(a.work)
    os.makedirs(work, exist_ok=True)
    rng = np.random.default_rng(0)
    seqs = {s: [int(t) for t in rng.integers(0, VOCAB, s)] for s in (40, 150)}
    # transformers first: with NX-AI's package importable it would run that package's code instead
    import transformers
    from transformers.models.xlstm import modeling_xlstm
    print(f"torch {torch.__version__}, transformers {transformers.__version__} (xLSTM code: "
          f"{'NX-AI package' if getattr(modeling_xlstm, 'external_xlstm', False) else 'its own'}), device {dev}, "
          f"mesanet backend {a.backend}; tolerance rel err {TOL:g}, argmax agreement {AGREE}")
    ok = check_hf(a, work, seqs, dev)
    sys.path.insert(0, os.path.abspath(a.peers))
    import xlstm
    print(f"NX-AI xlstm {getattr(xlstm, '__version__', '?')} from {os.path.dirname(xlstm.__file__)}")
    ok &= check_nxai(a, work, seqs, dev)
    print("all match" if ok else "SOME FAILED")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
