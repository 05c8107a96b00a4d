"""Checkpoint compatibility with fla's MesaNetForCausalLM (Hugging Face transformers).

Run on the GPU machine with fla's source in `.fla/` (not committed):

    python3 bench/fla_compat.py OURS_DIR FLA_OUT_DIR

1. OURS_DIR is a run directory written by `mesanet train` with the fla architecture; it holds
   tokens.txt and logits.f32 from `mesanet logits`. fla's model loads it (strictly: no missing or
   unexpected tensors) and its logits are compared with ours.
2. fla builds a model of the same config with its own initialisation and writes it as a Hugging Face
   checkpoint (model.safetensors, config.json without our "mesanet" block) into FLA_OUT_DIR, with its
   logits for the same tokens; `mesanet logits` then loads it and the logits are compared again.
"""
import json
import os
import sys

os.environ.setdefault("FLA_DISABLE_BACKEND_DISPATCH", "1")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".fla"))

import numpy as np  # noqa: E402
import torch  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402

from fla.models.mesa_net import MesaNetConfig, MesaNetForCausalLM  # noqa: E402


def logits_of(model, tokens):
    with torch.no_grad():
        return model(torch.tensor([tokens], device="cuda")).logits[0].float().cpu().numpy()


def main():
    ours, out = sys.argv[1], sys.argv[2]
    tokens = [int(t) for t in open(os.path.join(ours, "tokens.txt")).read().strip().split(",")]
    raw = json.load(open(os.path.join(ours, "config.json")))
    raw.pop("mesanet", None)
    cfg = MesaNetConfig(**{k: v for k, v in raw.items() if k not in ("architectures", "model_type")})
    model = MesaNetForCausalLM(cfg).cuda().float().eval()
    state = load_file(os.path.join(ours, "model.safetensors"))
    missing, unexpected = model.load_state_dict(state, strict=False)
    print(f"fla loads our checkpoint: {len(state)} tensors, missing {list(missing)}, unexpected {list(unexpected)}")
    theirs = logits_of(model, tokens)
    mine = np.fromfile(os.path.join(ours, "logits.f32"), dtype=np.float32).reshape(len(tokens), -1)
    err = np.linalg.norm(theirs - mine) / np.linalg.norm(mine)
    agree = (theirs.argmax(-1) == mine.argmax(-1)).mean()
    print(f"our checkpoint: logits fla vs mesanet rel err {err:.2e}, argmax agreement {agree:.3f}")

    torch.manual_seed(0)
    native = MesaNetForCausalLM(cfg).cuda().float().eval()
    os.makedirs(out, exist_ok=True)
    save_file({k: v.detach().contiguous().cpu() for k, v in native.state_dict().items()},
              os.path.join(out, "model.safetensors"), metadata={"format": "pt"})
    hf = cfg.to_dict()
    hf["model_type"] = "mesa_net"
    json.dump(hf, open(os.path.join(out, "config.json"), "w"), indent=2, default=str)
    logits_of(native, tokens).astype(np.float32).tofile(os.path.join(out, "logits.f32"))
    open(os.path.join(out, "tokens.txt"), "w").write(",".join(map(str, tokens)))
    print(f"wrote fla's own checkpoint and logits to {out}")


if __name__ == "__main__":
    main()
